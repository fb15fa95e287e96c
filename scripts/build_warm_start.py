"""Build a shipped warm start: behaviour cloning from a config, measured, written as a package asset.

    python scripts/build_warm_start.py                       # configs/warm_start.yaml -> alfworld_lite-tiny
    python scripts/build_warm_start.py --config C --name N   # another one
    python scripts/build_warm_start.py --config C --name N model.device=cuda sft.demos=400   # with overrides
    python scripts/build_warm_start.py --from-run RUN --config C --name N train.seed=1  # ship a run's final model

Writes ``src/streamrl/policy/assets/warm_starts/NAME/``: the policy folder (``Policy.save``) and
``warm_start.json`` with the exact command, the config file's sha256 and resolved sections, the
sha256 of every file, the SFT metrics, the held-out success (greedy, and sampled at the config's
``eval.temperature``), the processor, torch version and build time. ``model.init_from:
warm-start:NAME`` then loads it; ``tests/policy/test_warm_start_asset.py`` checks the shipped files
against this record. The build is seeded (``train.seed``), so the same config on the same
software rebuilds the same demonstrations; float summation order can still differ across
processors, so the held-out numbers are those of the recorded build.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from streamrl.policy.dtype_choice import processor_name  # noqa: E402
from streamrl.policy.loading import WARM_START_MANIFEST, load_policy  # noqa: E402
from streamrl.training.config import Config  # noqa: E402
from streamrl.training.config_files import load_config
from streamrl.training.evaluate import evaluate  # noqa: E402
from streamrl.training.run import load_run_policy  # noqa: E402
from streamrl.training.sft import behaviour_cloning, demonstrations_and_heldout  # noqa: E402

ROOT = REPO / "src" / "streamrl" / "policy" / "assets" / "warm_starts"
SECTIONS = ("model", "env", "sft", "rollout", "eval")
#: a shipped RL result also records how it was trained
RUN_SECTIONS = (*SECTIONS, "algo", "optim", "train")
#: applied on top of the config file: a warm start is built in float32 on every processor, so
#: the asset does not depend on what ``model.dtype: auto`` picks on the build machine
BUILD_OVERRIDES = ["model.dtype=float32"]


def portable_adapter(folder: Path) -> None:
    """A shipped adapter names no base folder of the build machine (``load_policy`` rebuilds the base
    from the recipe in streamrl_policy.json wherever it runs), so PEFT's generated model card goes
    too: it is a blank template whose front matter names that folder, and warm_start.json is the
    asset's card."""
    path = folder / "adapter_config.json"
    if path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
        config["base_model_name_or_path"] = None
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (folder / "README.md").unlink(missing_ok=True)


def device_name(device: str) -> str:
    """What the build ran on: the processor, or the GPU's name for a CUDA build."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def held_out(config: Config, policy, greedy: bool) -> float:
    """Success on the environment's held-out split, greedy or sampled at ``eval.temperature``."""
    from streamrl.policy.hf_engine import HFEngine

    config = config.model_copy(update={"eval": config.eval.model_copy(update={"greedy": greedy})})
    engine = HFEngine.from_policy(policy, seed=config.train.seed)
    try:
        result = await evaluate(config, engine, policy)
    finally:
        await engine.close()
    return float(result.success)


def build(config_path: Path, name: str, overrides: list[str] = ()) -> dict:
    config = load_config(str(config_path), [*BUILD_OVERRIDES, *overrides])
    started = time.perf_counter()
    policy = load_run_policy(config, None)
    demos, heldout = asyncio.run(demonstrations_and_heldout(config, policy))
    sft = behaviour_cloning(config, policy, demos, log=lambda step, m: print(f"sft step {step}: {m}", flush=True),
                            heldout=heldout)
    sft_seconds = time.perf_counter() - started
    greedy = asyncio.run(held_out(config, policy, greedy=True))
    sampled = asyncio.run(held_out(config, policy, greedy=False))
    out = ROOT / name
    with tempfile.TemporaryDirectory(dir=ROOT.parent) as tmp:
        staged = Path(tmp) / name
        policy.save(staged, tokenizer=not policy.is_lora)
        portable_adapter(staged)
        files = {p.name: sha256(p) for p in sorted(staged.iterdir()) if p.is_file()}
        record = {
            "name": name,
            "command": " ".join(["python scripts/build_warm_start.py --config", str(config_path.relative_to(REPO)),
                                 "--name", name, *overrides]),
            "config_file": str(config_path.relative_to(REPO)),
            "config_sha256": sha256(config_path),
            "overrides": list(overrides),
            "config": {section: getattr(config, section).model_dump(mode="json") for section in SECTIONS},
            "seed": config.train.seed,
            "files": files,
            "sft": {"demonstrations": len(demos), **{k: round(float(v), 4) for k, v in sft.items()}},
            "held_out": {
                "split": config.env.eval_split or "default",
                "greedy_success": round(greedy, 4),
                "sampled_success": round(sampled, 4),
                "sampled_temperature": config.eval.temperature,
            },
            "processor": processor_name(),
            "device": device_name(config.model.device),
            "torch": __import__("torch").__version__,
            "build_seconds": round(time.perf_counter() - started, 1),
            "sft_seconds": round(sft_seconds, 1),
        }
        (staged / WARM_START_MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
        _install(staged, out)
    return record


def _install(staged: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staged), out)


def ship_run(run: Path, config_path: Path, name: str, overrides: list[str] = ()) -> dict:
    """Ship ``run``'s ``final_model`` (a finished ``streamrl train`` run of ``config_path`` with
    ``overrides``) as the asset ``name``: the adapter without a tokenizer, and a record of the run's
    command, configuration, held-out success before and after RL, steps and RL time."""
    config = load_config(str(config_path), list(overrides))
    saved = load_config(str(run / "config.yaml"))
    if saved != config:
        raise SystemExit(f"--from-run: {run}/config.yaml is not {config_path} with {' '.join(overrides) or 'no overrides'}")
    summary = json.loads((run / "summary.json").read_text())
    if "eval_after" not in summary:
        raise SystemExit(f"--from-run: {run} has no final evaluation (summary.json has no eval_after)")
    # the dtype the run resolved (``auto`` picks per processor) is the one its weights were trained in
    config.model = config.model.model_copy(update={"dtype": summary["model"]["dtype"]})
    policy = load_policy(str(run / "final_model"))
    out = ROOT / name
    with tempfile.TemporaryDirectory(dir=ROOT.parent) as tmp:
        staged = Path(tmp) / name
        policy.save(staged, tokenizer=False)
        portable_adapter(staged)
        before = summary.get("eval_before") or {}
        record = {
            "name": name,
            "command": " ".join(["streamrl train --config", str(config_path.relative_to(REPO)), "--out", str(run),
                                 *overrides]),
            "shipped_with": " ".join(["python scripts/build_warm_start.py --from-run", str(run), "--config",
                                      str(config_path.relative_to(REPO)), "--name", name, *overrides]),
            "config_file": str(config_path.relative_to(REPO)),
            "config_sha256": sha256(config_path),
            "overrides": list(overrides),
            "config": {section: getattr(config, section).model_dump(mode="json") for section in RUN_SECTIONS},
            "seed": config.train.seed,
            "files": {p.name: sha256(p) for p in sorted(staged.iterdir()) if p.is_file()},
            "rl": {key: summary.get(key) for key in ("steps", "rl_s", "stopped_by")},
            "held_out": {
                "split": config.env.eval_split or "default",
                "greedy_success": round(float(summary["eval_after"]["success"]), 4),
                "greedy_success_before_rl": round(float(before["success"]), 4) if before else None,
            },
            "processor": processor_name(),
            "device": device_name(config.model.device),
            "torch": __import__("torch").__version__,
        }
        (staged / WARM_START_MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
        _install(staged, out)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "warm_start.yaml"))
    parser.add_argument("--name", default="alfworld_lite-tiny")
    parser.add_argument("overrides", nargs="*", help="config overrides, as for `streamrl train` (section.field=value)")
    parser.add_argument("--from-run", type=Path, help="ship this finished run's final_model instead of building")
    args = parser.parse_args()
    # absolute, not resolved: configs/ is a link into the package, and the record names the path as given
    if args.from_run:
        record = ship_run(args.from_run, Path(args.config).absolute(), args.name, args.overrides)
        held = record["held_out"]
        print(f"shipped {record['name']}: held-out greedy {100 * held['greedy_success']:.1f}% -> {ROOT / record['name']}")
        return 0
    record = build(Path(args.config).absolute(), args.name, args.overrides)
    held = record["held_out"]
    print(f"warm start {record['name']}: held-out greedy {100 * held['greedy_success']:.1f}%, "
          f"sampled (T={held['sampled_temperature']}) {100 * held['sampled_success']:.1f}%, "
          f"built in {record['build_seconds']:.0f} s -> {ROOT / record['name']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
