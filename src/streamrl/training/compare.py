"""Paired-seed comparisons: the same seeds, warm start, prompts and budget for every arm.

A comparison file (``configs/compare/*.yaml``)::

    name: spopp_vs_spo
    base: [configs/study_alfworld.yaml]     # the training config every arm starts from
    overrides: [train.steps=40]             # applied to every arm
    seeds: [0, 1, 2, 3, 4]
    arms:                                   # name -> algorithm + its own overrides
      spo++: {algo: spo++}
      spo: {algo: spo}
      spo++ traj-norm: {algo: spo++, overrides: [algo.norm_measure=traj]}
    pairs: [[spo++, spo], [spo++, spo++ traj-norm]]
    jobs: 1                                 # runs at once (separate processes)

Per seed, the SFT warm start is trained once and shared by every arm (``model.init_from``), so
paired runs differ only in the algorithm; with ``shared_warm_start: false`` every run starts from
the model the config names (a shipped warm start), evaluated once in ``<out>/start``. Each run is a ``streamrl train`` process in
``<out>/runs/<arm>/seed_<s>``; finished runs are not rerun, interrupted ones are resumed. The report
(``report.md``, ``report.json``, ``curves.png``) gives per-run learning AUC and final reward on the
training-success curve against trajectories consumed, paired differences with 95% intervals,
held-out success, and optimisation diagnostics.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from streamrl.algos import final_reward, interpolate, learning_auc, paired_difference, union_grid
from streamrl.training.config import ALGORITHMS, ConfigError
from streamrl.training.config_files import format_validation_error, load_config, read_yaml, resolve_config
from streamrl.training.loggers import read_metrics
from streamrl.training.preflight import preflight

#: run means of these training metrics appear per arm (the last two show a policy drifting off format
#: and the net push of the advantages, sum L_i A_i / sum L_i, which N_tok makes exactly 0)
DIAGNOSTICS = ("ppo_kl", "clip_frac", "behaviour_kl", "grad_norm", "entropy", "format_invalid_frac", "token_weighted_adv_mean",
               "baseline_bias", "lag_mean", "stale_frac")


class Arm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    algo: str
    overrides: list[str] = []

    @model_validator(mode="after")
    def _known(self) -> Arm:
        if self.algo not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algo!r} (allowed: {', '.join(ALGORITHMS)})")
        return self


class CompareConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    base: list[str]
    overrides: list[str] = []
    seeds: list[int] = Field(min_length=1)
    arms: dict[str, Arm] = Field(min_length=2)
    pairs: list[tuple[str, str]] = []
    #: the training metric that forms the learning curve, its range, and the progress axis
    metric: str = "success"
    y_range: tuple[float, float] = (0.0, 1.0)
    x_axis: str = "trajectories_consumed"
    jobs: int = Field(1, ge=1)
    shared_warm_start: bool = True

    @model_validator(mode="after")
    def _pairs_name_arms(self) -> CompareConfig:
        for a, b in self.pairs:
            for arm in (a, b):
                if arm not in self.arms:
                    raise ValueError(f"pairs: {arm!r} is not an arm (arms: {', '.join(self.arms)})")
        return self


def load_compare_config(path: str | Path) -> CompareConfig:
    try:
        return CompareConfig.model_validate(read_yaml(resolve_config(path), "comparison file"))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "+-_" else "_" for c in text)


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamrl", *args]


def _run(command: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(f"\n$ {' '.join(command)}\n")
        handle.flush()
        result = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[3:5])} failed (exit {result.returncode}); see {log}")


def _log(folder: Path) -> Path:
    """A run's console log, beside its folder (a run folder holds only what the run writes)."""
    return folder.parent / f"{folder.name}.log"


#: (seed or None, the SFT command or None, the command evaluating the start on the held-out split, its folder)
WarmStart = tuple[int | None, list[str] | None, list[str], Path]
#: where the common start of every run is evaluated when the runs start from the config's own model
START = "start"


def plan_runs(spec: CompareConfig, out: Path) -> tuple[list[WarmStart], list[tuple[str, int, list[str], Path]]]:
    """The starting points and the arm runs, as commands. With ``shared_warm_start``, per seed: the
    SFT command and the command evaluating its model on the held-out split, the common start of
    every arm. Without, every run starts from the model the config names (a shipped warm start):
    one evaluation of it, the "before" of every run, instead of one per run."""
    configs = [arg for path in spec.base for arg in ("--config", path)]
    warm: list[WarmStart] = []
    runs = []
    if not spec.shared_warm_start:
        folder = out / START
        warm.append((None, None, ["eval", *configs, "--json", str(folder / "eval.json"), "--out", str(folder / "eval"),
                                  *spec.overrides, f"train.seed={spec.seeds[0]}"], folder))
    for seed in spec.seeds:
        seed_args = [*spec.overrides, f"train.seed={seed}"]
        init: list[str] = []
        if spec.shared_warm_start:
            folder = out / "warm_start" / f"seed_{seed}"
            evaluation = ["eval", *configs, "--model", str(folder / "sft_model"), "--json", str(folder / "eval.json"), *seed_args]
            warm.append((seed, ["sft", *configs, "--out", str(folder), *seed_args], evaluation, folder))
            init = [f"model.init_from={folder / 'sft_model'}", "sft.demos=0"]
        for name, arm in spec.arms.items():
            folder = out / "runs" / _slug(name) / f"seed_{seed}"
            command = ["train", *configs, "--algo", arm.algo, "--out", str(folder), *seed_args, *arm.overrides, *init]
            runs.append((name, seed, command, folder))
    return warm, runs


def run_comparison(path: str | Path | None, out: str | Path | None = None, overrides: list[str] | None = None) -> Path:
    if path is None:
        raise ConfigError("compare needs --config configs/compare/<name>.yaml")
    spec = load_compare_config(path)
    spec.overrides = [*spec.overrides, *(overrides or [])]
    out = Path(out) if out else Path("runs") / "compare" / spec.name
    for name, arm in spec.arms.items():  # validate and preflight every arm's configuration before any work
        config = load_config(spec.base, [*spec.overrides, *arm.overrides], algo=arm.algo)
        preflight(config, demonstrations=config.sft.demos > 0 and config.model.init_from is None)
    out.mkdir(parents=True, exist_ok=True)
    warm, runs = plan_runs(spec, out)

    def do_warm(item: WarmStart) -> None:
        seed, command, evaluation, folder = item
        if command is not None and not (folder / "sft_model" / "config.json").is_file():  # an interrupted SFT starts again
            _run(_command(*command, *(["--overwrite"] if folder.exists() else [])), _log(folder))
        if not (folder / "eval.json").is_file():
            _run(_command(*evaluation), _log(folder))

    def do_run(item: tuple[str, int, list[str], Path]) -> None:
        name, seed, command, folder = item
        if (folder / "summary.json").is_file():
            return  # finished earlier: not rerun
        resume = ["--resume"] if folder.exists() else []
        started = time.monotonic()
        _run(_command(*command, *resume), _log(folder))
        print(f"[compare] {name} seed {seed}: {time.monotonic() - started:.0f} s", flush=True)

    with ThreadPoolExecutor(spec.jobs) as pool:
        list(pool.map(do_warm, warm))
        list(pool.map(do_run, runs))
    return write_comparison_report(spec, out, [(name, seed, folder) for name, seed, _, folder in runs])


def _warm_start_success(out: Path, seed: int) -> float | None:
    """Held-out success of a seed's shared warm start, else of the common start (written by their
    evaluations), if any."""
    for path in (out / "warm_start" / f"seed_{seed}" / "eval.json", out / START / "eval.json"):
        if path.is_file():
            return json.loads(path.read_text())["success"]
    return None


def run_statistics(folder: Path, spec: CompareConfig) -> dict[str, Any]:
    records = read_metrics(folder / "metrics.jsonl", "train")
    x = np.array([r[spec.x_axis] for r in records], dtype=float)
    y = np.array([r[spec.metric] for r in records], dtype=float)
    evals = read_metrics(folder / "metrics.jsonl", "eval")
    stats = {
        "x": x.tolist(),
        "y": y.tolist(),
        "auc": learning_auc(x, y, spec.y_range),
        "final": final_reward(y, spec.y_range),
        "eval_before": evals[0]["success"] if len(evals) > 1 else None,
        "eval_after": evals[-1]["success"] if evals else None,
        "score_after": evals[-1].get("score") if evals else None,
    }
    for key in DIAGNOSTICS:
        values = [r[key] for r in records if r.get(key) is not None]
        stats[key] = float(np.mean(values)) if values else None
    return stats


def write_comparison_report(spec: CompareConfig, out: Path, runs: list[tuple[str, int, Path]]) -> Path:
    stats: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in spec.arms}
    for name, seed, folder in runs:
        stats[name][seed] = run_statistics(folder, spec)
        if stats[name][seed]["eval_before"] is None:
            stats[name][seed]["eval_before"] = _warm_start_success(out, seed)

    arms = {}
    for name, by_seed in stats.items():
        aucs = [s["auc"] for s in by_seed.values()]
        row = {
            "auc_mean": float(np.mean(aucs)),
            "auc_sd": float(np.std(aucs, ddof=1)) if len(aucs) > 1 else 0.0,
            "final_mean": float(np.mean([s["final"] for s in by_seed.values()])),
            "eval_before_mean": _mean([s["eval_before"] for s in by_seed.values()]),
            "eval_after_mean": _mean([s["eval_after"] for s in by_seed.values()]),
            "score_after_mean": _mean([s.get("score_after") for s in by_seed.values()]),
        }
        for key in DIAGNOSTICS:
            row[key] = _mean([s[key] for s in by_seed.values()])
        arms[name] = row
    pairs = []
    for a, b in spec.pairs:
        seeds = [s for s in spec.seeds if s in stats[a] and s in stats[b]]
        pair: dict[str, Any] = {"a": a, "b": b, "n": len(seeds)}
        for key, field, scale in (("auc", "auc_points", 100), ("final", "final_points", 100),
                                  ("eval_after", "held_out_points", 100), ("score_after", "score_points", 100),
                                  ("baseline_bias", "baseline_bias_points", 100)):
            values = [(stats[a][s].get(key), stats[b][s].get(key)) for s in seeds]
            known = [(x, y) for x, y in values if x is not None and y is not None]
            if values and len(known) == len(values):  # held-out needs both evaluated
                pair[field] = paired_difference([scale * x for x, _ in known], [scale * y for _, y in known])._asdict()
        pairs.append(pair)

    report = {"name": spec.name, "seeds": spec.seeds, "arms": arms, "pairs": pairs, "runs": stats, "config": spec.model_dump()}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    _plot(spec, stats, out / "curves.png")
    (out / "report.md").write_text(_markdown(spec, arms, pairs))
    return out / "report.md"


def _mean(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{scale * value:.{digits}f}"


def _difference(d: dict[str, float] | None) -> str:
    if d is None:
        return "-"
    return f"{d['mean']:+.1f} ± {d['sd']:.1f} [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}]"


def _graded(arms: dict[str, dict]) -> bool:
    """Whether the environment's score says more than its success (a graded reward, WebShop's)."""
    return any(
        row.get("score_after_mean") is not None and row["eval_after_mean"] is not None
        and abs(row["score_after_mean"] - row["eval_after_mean"]) > 1e-6
        for row in arms.values()
    )


def _markdown(spec: CompareConfig, arms: dict[str, dict], pairs: list[dict]) -> str:
    graded = _graded(arms)
    score_header, score_rule = (" held-out score after |", "---|") if graded else ("", "")
    lines = [
        f"# Comparison: {spec.name}",
        "",
        f"Seeds {spec.seeds}; learning curve = training `{spec.metric}` against `{spec.x_axis}`; AUC is the "
        "normalised-progress trapezoid (docs/algorithms.md §1.7), in points (x100); final = mean of the last 5 points.",
        "",
        f"| arm | AUC (mean ± sd) | final | held-out success before → after |{score_header} PPO-KL | clip frac "
        "| behaviour KL | grad norm | invalid format | token-weighted Â |",
        f"|---|---|---|---|{score_rule}---|---|---|---|---|---|",
    ]
    for name, row in arms.items():
        score = f" {_fmt(row['score_after_mean'], 100)} |" if graded else ""
        lines.append(
            f"| {name} | {100 * row['auc_mean']:.1f} ± {100 * row['auc_sd']:.1f} | {_fmt(row['final_mean'], 100)} | "
            f"{_fmt(row['eval_before_mean'], 100)} → {_fmt(row['eval_after_mean'], 100)} |{score} {_fmt(row['ppo_kl'], 1, 4)} | "
            f"{_fmt(row['clip_frac'], 1, 4)} | {_fmt(row['behaviour_kl'], 1, 4)} | {_fmt(row['grad_norm'], 1, 3)} | "
            f"{_fmt(row['format_invalid_frac'], 1, 3)} | {_fmt(row['token_weighted_adv_mean'], 1, 3)} |"
        )
    if pairs:
        keys = ["auc_points", "final_points", "held_out_points"] + (["score_points"] if graded else [])
        lines += ["", "Paired differences (a − b, per seed), points:", "",
                  "| a − b | n | AUC mean ± sd [95% CI] | final mean ± sd [95% CI] | held-out after mean ± sd [95% CI] |"
                  + (" held-out score after [95% CI] |" if graded else ""),
                  "|---|---|---|---|---|" + score_rule]
        for p in pairs:
            cells = [_difference(p.get(key)) for key in keys]
            lines.append(f"| {p['a']} − {p['b']} | {p['n']} | " + " | ".join(cells) + " |")
    if any(row.get("baseline_bias") is not None for row in arms.values()):
        lines += ["", "Baselines (single-stream arms): bias = mean(baseline − R) over trained episodes, in points "
                  "(each baseline was fixed before its own result, so this estimates the bias against the "
                  "serving snapshot's success rate); lag = learner versions between dispatch and training.", "",
                  "| arm | baseline bias | lag | stale (excluded) |", "|---|---|---|---|"]
        for name, row in arms.items():
            lines.append(f"| {name} | {_fmt(row['baseline_bias'], 100, 2)} | {_fmt(row['lag_mean'], 1, 2)} | "
                         f"{_fmt(row['stale_frac'], 1, 3)} |")
        biased = [p for p in pairs if p.get("baseline_bias_points")]
        if biased:
            lines += ["", "| a − b | baseline bias, points [95% CI] |", "|---|---|"]
            lines += [f"| {p['a']} − {p['b']} | {_difference(p['baseline_bias_points'])} |" for p in biased]
    lines += ["", "![learning curves](curves.png)", ""]
    return "\n".join(lines)


def _plot(spec: CompareConfig, stats: dict[str, dict[int, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, by_seed in stats.items():
        curves = list(by_seed.values())
        grid = union_grid(*[c["x"] for c in curves])
        ys = np.array([interpolate(c["x"], c["y"], grid) for c in curves])
        mean = ys.mean(axis=0)
        ax.plot(grid, mean, label=f"{name} (n={len(curves)})")
        if len(curves) > 1:
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), alpha=0.15)
    ax.set_xlabel(spec.x_axis.replace("_", " "))
    ax.set_ylabel(f"training {spec.metric}")
    ax.set_title(f"{spec.name}: mean and range over seeds")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
