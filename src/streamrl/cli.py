"""The ``streamrl`` command line.

    streamrl train   --config configs/default.yaml [--algo spo++] [--out runs/x] [--resume | --overwrite] [field=value ...]
    streamrl sft     --config ... --out runs/x              behaviour cloning only (writes runs/x/sft_model)
    streamrl eval    --config ... --model runs/x/final_model [--split unseen] [--tasks N]
    streamrl compare --config configs/compare/NAME.yaml [--out DIR]
    streamrl play    alfworld_lite [--seed N] [--task-id ID] [--model runs/x [--config ...]]
    streamrl show    runs/x [--last N] [--kind train|eval] [--failures]   transcripts from samples.jsonl
    streamrl export  runs/x --out DIR [--adapter]                          a plain Hugging Face folder
    streamrl list    [envs|algos|models]

Configuration is validated before any work starts; a bad value is reported as one line naming the
field (and, for a choice, the allowed values).
"""

from __future__ import annotations

import argparse
import os
import sys

from streamrl import __version__
from streamrl.commands import (
    CLIError,
    cmd_compare,
    cmd_eval,
    cmd_export,
    cmd_list,
    cmd_play,
    cmd_serve,
    cmd_sft,
    cmd_show,
    cmd_train,
    quiet_libraries,
)
from streamrl.play import option
from streamrl.policy.loading import DTYPE_NAMES
from streamrl.training.config import ALGORITHMS, ConfigError
from streamrl.training.preflight import one_line


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamrl", description="RL for multi-turn, tool-using LLM agents.")
    parser.add_argument("--version", action="version", version=f"streamrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser, out: bool = True) -> None:
        p.add_argument("--config", action="append", help="YAML file or shipped config name, e.g. smoke (repeatable; later files win)")
        p.add_argument("--env", help="environment (overrides env.name)")
        if out:
            p.add_argument("--out", help="run folder (default runs/<algo>-<env>)")
            p.add_argument("--model", dest="model_spec", help="tiny, smollm2-135m or a model folder (overrides model.spec)")
        p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=20 algo.dual_clip=3")

    train = sub.add_parser("train", help="(SFT warm start,) RL, evaluation, report")
    with_config(train)
    train.add_argument("--algo", choices=ALGORITHMS, help="algorithm (overrides algo.name)")
    train.add_argument("--agent", help="train this agent function instead of an environment: path/to/agent.py:run "
                                       "(async def run(client, task) -> float; docs/agents.md)")
    train.add_argument("--tasks", help="with --agent: JSONL file of tasks (agent.tasks)")
    folder = train.add_mutually_exclusive_group()
    folder.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint in --out")
    folder.add_argument("--overwrite", action="store_true", help="replace the run in a non-empty --out")
    train.set_defaults(func=cmd_train)

    sft = sub.add_parser("sft", help="behaviour cloning on demonstrations only")
    with_config(sft)
    sft.add_argument("--overwrite", action="store_true", help="replace what a non-empty --out holds")
    sft.set_defaults(func=cmd_sft)

    evaluate = sub.add_parser("eval", help="evaluate a model on a fixed task set")
    with_config(evaluate, out=False)
    evaluate.add_argument("--model", help="run folder, model folder or spec (default: model.init_from or model.spec)")
    evaluate.add_argument("--out", help="folder for the transcripts (default: RUN/eval-<env>-<split> for a run folder, "
                                        "else runs/eval-<env>-<split>)")
    evaluate.add_argument("--split", help="evaluation split, or several joined by + (default: the environment's)")
    evaluate.add_argument("--tasks", type=int, help="evaluate on N tasks of each split only")
    evaluate.add_argument("--json", help="also write the result to this JSON file")
    evaluate.set_defaults(func=cmd_eval)

    serve = sub.add_parser("serve", help="an OpenAI-compatible endpoint over the policy (--train: learn from its sessions)")
    with_config(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; another needs --token)")
    serve.add_argument("--port", type=int, default=8011, help="port (default 8011; 0: a free one)")
    serve.add_argument("--token", help="bearer token requests must carry (or $STREAMRL_ENDPOINT_TOKEN)")
    serve.add_argument("--train", action="store_true", help="train on sessions agents claim with POST /sessions/next")
    serve.add_argument("--tasks", help="with --train: JSONL file of tasks to dispatch")
    serve.add_argument("--algo", choices=ALGORITHMS, help="with --train: algorithm (overrides algo.name)")
    serve.set_defaults(func=cmd_serve)

    compare = sub.add_parser("compare", help="paired-seed comparison of algorithm configurations")
    with_config(compare)
    compare.set_defaults(func=cmd_compare)

    play = sub.add_parser("play", help="play an environment in the terminal")
    play.add_argument("env")
    play.add_argument("--seed", type=int)
    play.add_argument("--task-id")
    play.add_argument("--option", action="append", type=option, help="environment option KEY=VALUE")
    play.add_argument("--tools", action="store_true",
                      help="the tool form: call the environment's tools (with --model: env.tools=true)")
    play.add_argument("--model", help="let this policy play while you watch: a run folder, model folder or spec")
    play.add_argument("--config", action="append",
                      help="with --model: settings to play with (default: the run's config.yaml, else default)")
    play.add_argument("--temperature", type=float, help="with --model: sampling temperature (default: evaluation's)")
    play.add_argument("overrides", nargs="*", help="with --model: dotted overrides, e.g. rollout.max_new_tokens=64")
    play.set_defaults(func=cmd_play)

    show = sub.add_parser("show", help="print recent transcripts of a run (its samples.jsonl)")
    show.add_argument("run", help="run folder")
    show.add_argument("--last", type=_positive, default=5, help="newest N transcripts (default 5)")
    show.add_argument("--kind", choices=("train", "eval"), help="only training or only evaluation episodes")
    show.add_argument("--failures", action="store_true", help="only episodes that were not won")
    show.set_defaults(func=cmd_show)

    export = sub.add_parser("export", help="write a run's model as a standard Hugging Face folder")
    export.add_argument("source", metavar="RUN_OR_MODEL",
                        help="run folder (final_model, else newest valid checkpoint), model folder or spec")
    export.add_argument("--out", required=True, help="new folder to write")
    export.add_argument("--adapter", action="store_true",
                        help="write the LoRA adapter (with its base model's path) instead of merged weights")
    export.add_argument("--dtype", default="float32", choices=sorted(DTYPE_NAMES), help="weights dtype (default float32)")
    export.set_defaults(func=cmd_export)

    listing = sub.add_parser("list", help="list environments, algorithms and models")
    listing.add_argument("what", nargs="?", default="all", choices=("all", "envs", "algos", "models"))
    listing.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # dotted overrides are accepted on either side of options (`--out R train.steps=1`)
        if hasattr(args, "overrides") and all("=" in extra and not extra.startswith("-") for extra in extras):
            args.overrides = [*args.overrides, *extras]
        else:
            parser.parse_args(argv)  # the usual argparse error for what is left over
    quiet_libraries()
    if os.getcwd() not in sys.path:  # --env my_pkg.my_env:MyEnv imports from here, as python -m would
        sys.path.insert(0, os.getcwd())
    from streamrl.envs import UnknownEnvironmentError
    from streamrl.envs.registry import EnvOptionError
    from streamrl.policy.errors import ChatTemplateError, MissingDependencyError, PolicyLoadError
    from streamrl.rollout import DeadEnvironmentError
    from streamrl.training.errors import RunFolderError, TrainingError, TrainingInterrupted

    try:
        return args.func(args)
    except (CLIError, ConfigError, RunFolderError, EnvOptionError, PolicyLoadError, MissingDependencyError,
            ChatTemplateError, UnknownEnvironmentError, FileNotFoundError) as error:
        print(f"streamrl {args.command}: error: {one_line(error)}", file=sys.stderr)
        return 2
    except (TrainingError, DeadEnvironmentError) as error:  # training stopped itself: one line, status 1
        print(f"streamrl {args.command}: error: {one_line(error)}", file=sys.stderr)
        return 1
    except TrainingInterrupted as stopped:  # SIGTERM / SIGINT after a checkpoint
        print(f"streamrl {args.command}: {stopped}", file=sys.stderr)
        return 128 + stopped.signal_number
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
