"""What each ``streamrl`` subcommand does (``cli.py`` parses the command line and turns errors into
one line)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from streamrl.api import warn
from streamrl.training.config import ALGORITHMS, Config, ConfigError
from streamrl.training.config_files import load_config
from streamrl.training.preflight import preflight

#: the shipped configuration a command without --config runs (package data: works outside the clone)
DEFAULT_CONFIG = "default"


class CLIError(Exception):
    """A user-facing problem: printed as one line, exit status 2."""


def quiet_libraries() -> None:
    """Libraries' chatter off, by environment variables: importing transformers here would make a
    typo in a config key wait for it (``quiet_transformers`` runs once the input is checked)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def quiet_transformers() -> None:
    """transformers' own progress bars off (loading and saving shards): after the input is checked."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def _config(args: argparse.Namespace, check: bool = True) -> Config:
    paths = args.config or []
    if not paths and getattr(args, "resume", False) and args.out and (Path(args.out) / "config.yaml").is_file():
        paths = [Path(args.out) / "config.yaml"]
    if not paths:
        paths = [DEFAULT_CONFIG]
    overrides = list(args.overrides)
    if getattr(args, "model_spec", None):
        overrides.append(f"model.spec={args.model_spec}")
    if getattr(args, "env", None):
        overrides.append(f"env.name={args.env}")
    if getattr(args, "agent", None):
        overrides += [f"agent.function={args.agent}", *([f"agent.tasks={args.tasks}"] if args.tasks else [])]
    elif getattr(args, "tasks", None) and args.command == "train":
        raise CLIError(f"--tasks {args.tasks}: goes with --agent (the tasks an agent function plays); "
                       "an environment's tasks are env.train_tasks / env.eval_tasks")
    config = load_config(paths, overrides, algo=getattr(args, "algo", None))
    if check:
        preflight(config, demonstrations=args.command == "sft", warn=warn)
    quiet_transformers()
    return config


def _out_dir(args: argparse.Namespace, config: Config) -> Path:
    return Path(args.out).expanduser() if args.out else Path("runs") / f"{config.algo.name}-{safe_name(config.task_label())}"


def cmd_train(args: argparse.Namespace) -> int:
    from streamrl.api import train

    config = _config(args, check=False)  # streamrl.train preflights
    out = _out_dir(args, config)
    summary = train(config, out, resume=args.resume, overwrite=args.overwrite)
    if summary.get("finished_earlier"):
        return 0
    before, after = summary.get("eval_before"), summary.get("eval_after")
    if after:
        line = f"held-out success ({after['split']}, {after['episodes']} tasks): "
        line += f"{100 * before['success']:.1f}% -> " if before else ""
        line += f"{100 * after['success']:.1f}% after {summary['steps']} RL steps"
        if abs(after["score"] - after["success"]) > 1e-9:  # a graded reward (WebShop's score)
            line += f"; score {100 * before['score']:.1f} -> " if before else "; score "
            line += f"{100 * after['score']:.1f}"
        print(line)
    print(f"run folder: {out} (metrics.jsonl, report/)")
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    config = _config(args)  # answered before torch loads
    from streamrl.training.loggers import MetricsLogger
    from streamrl.training.run import claim_folder, load_run_policy
    from streamrl.training.sft import behaviour_cloning, demonstrations_and_heldout

    out = _out_dir(args, config)
    claim_folder(out, overwrite=args.overwrite)
    policy = load_run_policy(config, None)
    demos, heldout = asyncio.run(demonstrations_and_heldout(config, policy))
    logger = MetricsLogger(out / "metrics.jsonl", resume_offset=0)
    metrics = behaviour_cloning(config, policy, demos, log=lambda s, m: logger.log(s, m, "sft"), heldout=heldout)
    logger.close()
    policy.save(out / "sft_model")
    held = f", held-out actions exact {metrics['heldout_action_exact']:.1%}" if heldout else ""
    print(f"SFT on {len(demos)} demonstrations: NLL {metrics['nll']:.3f}{held}; model in {out / 'sft_model'}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from streamrl.api import evaluate
    from streamrl.training.report import eval_table

    overrides = list(args.overrides)
    if args.split:
        overrides.append(f"env.eval_split={args.split}")
    if args.tasks:
        overrides.append(f"env.eval_tasks={args.tasks}")
    args.overrides = overrides
    model, run = model_of(args.model, "--model") if args.model else (None, None)
    if run is not None and not args.config and (run / "config.yaml").is_file():
        args.config = [str(run / "config.yaml")]  # a run folder is evaluated with its own settings
    config = _config(args, check=False)  # streamrl.evaluate preflights
    out = Path(args.out).expanduser() if args.out else (run or Path("runs")) / f"eval-{safe_name(config.task_label())}-{eval_split(config)}"
    record = {"step": 0, **evaluate(config, model, out=out)}
    record["model"] = args.model or record["model"]
    print(eval_table([record]))
    print(f"success {100 * record['success']:.1f}%, score {100 * record['score']:.1f} (of 100); "
          f"transcripts: {out / 'samples.md'}")
    if args.json:
        Path(args.json).expanduser().write_text(json.dumps(record, indent=2))
    return 0


def eval_split(config: Config) -> str:
    """The split an evaluation runs on: the agent's (its tasks file decides), ``env.eval_split``, else
    the environment's own."""
    if config.agent.function:
        from streamrl.training.agent_mode import eval_split as agent_eval_split

        return agent_eval_split(config)
    if config.env.eval_split:
        return config.env.eval_split
    from streamrl.training.environment import Environment

    return Environment.of(config.env).spec().eval_split


def safe_name(name: str) -> str:
    """``name`` fit for a folder name: ``examples.custom_env:EchoEnv`` -> ``examples.custom_env-EchoEnv``."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)


def cmd_serve(args: argparse.Namespace) -> int:
    """The endpoint alone (``--train``: learning from the sessions that agents elsewhere claim)."""
    if args.token:
        os.environ["STREAMRL_ENDPOINT_TOKEN"] = args.token
    if args.host not in ("127.0.0.1", "localhost", "::1") and not os.environ.get("STREAMRL_ENDPOINT_TOKEN"):
        raise CLIError(f"--host {args.host}: serving beyond this machine needs --token (a bearer token every request must carry)")
    if args.train:
        if not args.tasks:
            raise CLIError("--train: needs --tasks FILE.jsonl (the tasks agents claim with POST /sessions/next)")
        args.overrides = [*args.overrides, "agent.external=true", f"agent.tasks={args.tasks}", f"agent.host={args.host}",
                          f"agent.port={args.port}", "train.eval_at_start=false"]
        args.resume = args.overwrite = False
        return cmd_train(args)

    config = _config(args)  # answered before torch loads
    from streamrl.agents import Endpoint, EndpointServer, EndpointSettings, build_app
    from streamrl.policy.engines import make_engine
    from streamrl.training.run import load_run_policy

    policy = load_run_policy(config, None)

    async def serve() -> None:
        engine = make_engine(config.model.engine, policy, seed=config.train.seed, threads=config.model.threads)
        endpoint = Endpoint(engine, policy, policy.tool_format,
                            settings=EndpointSettings(max_new_tokens=config.rollout.max_new_tokens,
                                                      max_tokens_cap=config.agent.max_tokens,
                                                      max_context_tokens=config.rollout.max_context_tokens,
                                                      token=os.environ.get("STREAMRL_ENDPOINT_TOKEN") or None))
        server = await EndpointServer(build_app(endpoint), args.host, args.port).start()
        print(f"serving {config.model.init_from or config.model.spec} at {server.url}/v1 (Ctrl-C stops)", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.close()
            await engine.close()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from streamrl.training.compare import run_comparison

    if len(args.config or []) > 1:
        raise CLIError(f"--config: compare takes one comparison file, got {len(args.config)} (training configs go in its base:)")
    overrides = [*args.overrides, *([f"env.name={args.env}"] if args.env else []),
                 *([f"model.spec={args.model_spec}"] if args.model_spec else [])]
    report = run_comparison(args.config[0] if args.config else None, out=args.out, overrides=overrides)
    print(f"comparison report: {report}")
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    from streamrl.envs import UnknownEnvironmentError
    from streamrl.envs.registry import EnvOptionError
    from streamrl.play import Narrating, play, watch

    options = dict(args.option or [])
    if not args.model:
        if args.config:
            raise CLIError("--config: only used with --model (a person playing needs no configuration)")
        try:
            return play(args.env, args.seed, args.task_id, options, sys.stdin, sys.stdout, args.tools)
        except (UnknownEnvironmentError, EnvOptionError):
            raise
        except Exception as error:  # an environment that cannot start: one line, as train says it
            raise CLIError(f"{args.env}: the environment cannot be played ({type(error).__name__}: {error})") from None
    from streamrl.api import warn as warning
    from streamrl.policy.engines import make_engine
    from streamrl.policy.loading import load_policy
    from streamrl.training.evaluate import episode_runner, episode_settings

    model, run = model_of(args.model, "--model")
    config = _play_config(args, run)
    preflight(config, warn=warning)
    quiet_transformers()
    policy = load_policy(model, dtype=config.model.dtype, device=config.model.device, threads=config.model.threads,
                         tool_format=config.model.tool_format)
    temperature = args.temperature if args.temperature is not None else (
        0.0 if config.eval.greedy else config.eval.temperature)
    # the engine the run trained with (model.engine, model.rollout_dtype), narrated as it plays
    engine = make_engine(config.model.engine, policy, seed=config.train.seed, rollout_dtype=config.model.rollout_dtype,
                         threads=config.model.threads)
    try:
        runner = episode_runner(config, Narrating(engine, sys.stdout), policy, episode_settings(config, temperature=temperature))
        return watch(config.env.name, args.seed, args.task_id, dict(config.env.options), runner, sys.stdout)
    finally:
        asyncio.run(engine.close())


def _play_config(args: argparse.Namespace, run: Path | None) -> Config:
    """The evaluation settings a watched model plays with: ``--config``, else the run's own
    ``config.yaml``, else the default config. The environment, parser and prompt options of a
    config written for another environment are dropped (they belong to that environment)."""
    overrides = [f"env.name={args.env}", *(["env.tools=true"] if args.tools else []), *args.overrides]
    def silent(_: str) -> None:  # the model that plays is --model: no warm start or SFT to skip
        pass

    if args.config:
        return load_config(args.config, overrides, note=silent)
    path = run / "config.yaml" if run is not None and (run / "config.yaml").is_file() else DEFAULT_CONFIG
    config = load_config(path, overrides, note=silent)
    if args.option:
        config.env.options = {**config.env.options, **dict(args.option)}
    # the model that plays is --model: the config's own model fields are not loaded (nor checked),
    # and nothing is logged
    config.model.spec, config.model.init_from = "tiny", None
    config.logging = type(config.logging)(progress=False, tensorboard=False)
    return config


def model_of(spec: str, field: str) -> tuple[str, Path | None]:
    """``(model, run)``: a run folder's model (``final_model``, else the newest valid checkpoint's
    policy) and the run folder; a model folder or spec as it is (run None)."""
    from streamrl.policy.loading import POLICY_FILE
    from streamrl.training.checkpoint import latest_valid

    def is_model(folder: Path) -> bool:
        return any((folder / name).is_file() for name in ("config.json", "adapter_config.json", POLICY_FILE))

    folder = Path(spec).expanduser()
    if not folder.is_dir() or is_model(folder):
        return spec, None
    if (folder / "final_model").is_dir() and is_model(folder / "final_model"):
        return str(folder / "final_model"), folder
    checkpoint = latest_valid(folder / "checkpoints", warn=warn)
    if checkpoint is not None and is_model(checkpoint.path / "policy"):
        return str(checkpoint.path / "policy"), folder
    raise CLIError(f"{field}: {spec} is neither a model folder nor a run folder with final_model/ or a valid "
                   "checkpoint")


def cmd_show(args: argparse.Namespace) -> int:
    from streamrl.training.samples import plain_transcript, read_samples, rich_transcript, select_samples

    run = Path(args.run)
    if not run.is_dir():
        raise CLIError(f"RUN: no run folder at {args.run}")
    path = run / "samples.jsonl"
    if not path.is_file():
        raise CLIError(f"RUN: {path} does not exist (training and evaluation write transcripts there; "
                       "is this a run folder?)")
    every = read_samples(path)
    if args.kind in (None, "train") and not any(r.get("kind") == "train" for r in every):
        print(f"no training transcripts in {path}: {_why_no_training_samples(run)}", file=sys.stderr)
    records = select_samples(every, last=args.last, kind=args.kind, failures=args.failures)
    if not records:
        what = " ".join(filter(None, ["lost" if args.failures else None, args.kind]))
        print(f"no {what + ' ' if what else ''}transcripts in {path} yet")
        return 0
    if sys.stdout.isatty():
        from rich.console import Console

        console = Console()
        for record in records:
            console.print(rich_transcript(record))
    else:
        sys.stdout.write("\n".join(plain_transcript(record) for record in records))
    return 0


def _why_no_training_samples(run: Path) -> str:
    """Why a run wrote no training transcripts (they come every ``logging.samples_every`` steps)."""
    from streamrl.training.loggers import read_metrics

    try:
        every = load_config(run / "config.yaml").logging.samples_every
    except ConfigError:
        return "its config.yaml cannot be read, so logging.samples_every is unknown"
    steps = max((int(r.get("step", 0)) for r in read_metrics(run / "metrics.jsonl", "train")), default=0)
    if not every:
        return "logging.samples_every is 0 (training transcripts off)"
    return (f"they are written every logging.samples_every={every} learner steps and the run has taken {steps}; "
            f"set logging.samples_every=1 to keep every step's")


def cmd_export(args: argparse.Namespace) -> int:
    from streamrl.policy.export import export_policy
    from streamrl.policy.loading import load_policy

    model, _ = model_of(args.source, "RUN_OR_MODEL")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CLIError(f"--out: {out} exists and is not an empty folder; choose a new one")
    if out.resolve() == Path(model).expanduser().resolve():
        raise CLIError("--out: the export would overwrite its source")
    quiet_transformers()
    policy = load_policy(model, dtype=args.dtype)
    folder = export_policy(policy, out, adapter=args.adapter)
    if args.adapter:
        print(f"LoRA adapter of {model} in {folder} (base: {_adapter_base(folder)}); "
              "load it with peft.AutoPeftModelForCausalLM.from_pretrained")
    else:
        merged = " (LoRA merged)" if policy.is_lora else ""
        print(f"{model}{merged} exported to {folder}; load it with transformers.AutoModelForCausalLM.from_pretrained")
    return 0


def _adapter_base(folder: Path) -> str:
    return str(json.loads((folder / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path"))


def cmd_list(args: argparse.Namespace) -> int:
    from streamrl.envs import list_envs
    from streamrl.policy.loading import KNOWN_SPECS, WARM_START_PREFIX, shipped_warm_starts

    what = args.what
    if what in ("envs", "all"):
        print("environments: " + ", ".join(list_envs()))
    if what in ("algos", "all"):
        print("algorithms:   " + ", ".join(ALGORITHMS))
    if what in ("models", "all"):
        print("models:       " + ", ".join(KNOWN_SPECS) + ", or a local Hugging Face model folder")
        print("warm starts:  " + (", ".join(WARM_START_PREFIX + name for name in shipped_warm_starts()) or "none"))
    return 0
