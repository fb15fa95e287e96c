"""The report folder written at the end of a run: learning curve PNG, evaluation tables, config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from streamrl.train.config import Config
from streamrl.train.loggers import read_metrics


def eval_table(records: list[dict]) -> str:
    """Markdown: one column per evaluation (policy version), one row per task type."""
    if not records:
        return "_no evaluation was run_\n"
    types = sorted({k.split("/", 1)[1] for r in records for k in r if k.startswith("success/")})
    header = "| task type | " + " | ".join(f"v{r['policy_version']} (step {r['step']})" for r in records) + " |"
    lines = [header, "|---" * (len(records) + 1) + "|"]
    for task_type in types:
        cells = [f"{100 * r[f'success/{task_type}']:.1f}" if f"success/{task_type}" in r else "-" for r in records]
        lines.append(f"| {task_type} | " + " | ".join(cells) + " |")
    lines.append("| **all** | " + " | ".join(f"**{100 * r['success']:.1f}**" for r in records) + " |")
    lines.append("| episodes | " + " | ".join(str(r["episodes"]) for r in records) + " |")
    return "\n".join(lines) + "\n"


def plot_learning_curve(train: list[dict], evals: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        x = [r.get("trajectories_consumed", r["step"]) for r in train]
        y = [r.get("success", 0.0) for r in train]
        ax.plot(x, y, alpha=0.35, label="training success (per batch)")
        window = max(1, len(y) // 10)
        smooth = [sum(y[max(0, i - window + 1) : i + 1]) / len(y[max(0, i - window + 1) : i + 1]) for i in range(len(y))]
        ax.plot(x, smooth, label=f"training success (mean of {window})")
    if evals:
        by_step = {r["step"]: r for r in evals}
        steps = sorted(by_step)
        lookup = {r["step"]: r.get("trajectories_consumed", r["step"]) for r in train}
        ax.plot([lookup.get(s, 0) for s in steps], [by_step[s]["success"] for s in steps], "o-", label="held-out success")
    ax.set_xlabel("trajectories consumed")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(root: Path, config: Config) -> Path:
    report = root / "report"
    report.mkdir(exist_ok=True)
    metrics = read_metrics(root / "metrics.jsonl")
    train = [r for r in metrics if r["kind"] == "train"]
    evals = [r for r in metrics if r["kind"] == "eval"]
    title = f"{config.algo.name} on {config.env.name} ({config.model.spec})"
    plot_learning_curve(train, evals, report / "learning_curve.png", title)
    (report / "eval.md").write_text(f"# Evaluation: {title}\n\n{eval_table(evals)}")
    shutil.copyfile(root / "config.yaml", report / "config.yaml")
    (report / "evaluations.json").write_text(json.dumps(evals, indent=2))
    return report
