"""The report folder written at the end of a run: learning curve PNG, evaluation tables,
transcripts of the last evaluation, config."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from streamrl.train.config import Config
from streamrl.train.loggers import read_metrics
from streamrl.train.samples import answer_lines

#: transcripts of each kind (success, failure) shown in report/samples.md
SHOWN_PER_KIND = 3


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


def last_evaluation(evals: list[dict]) -> list[dict]:
    """Of ``samples.jsonl``'s eval records, those of the last evaluation (its tag and step)."""
    if not evals:
        return []
    last = (evals[-1]["tag"], evals[-1]["step"])
    return [r for r in evals if (r["tag"], r["step"]) == last]


def samples_markdown(records: list[dict]) -> str:
    """Up to ``SHOWN_PER_KIND`` successes and as many failures, each as a readable transcript."""
    first = records[0]
    lines = [f"# Transcripts: {first['tag']} (step {first['step']}, {len(records)} episodes)", ""]
    for label, won in (("Success", True), ("Failure", False)):
        chosen = [r for r in records if r["won"] == won][:SHOWN_PER_KIND]
        if not chosen:
            lines += [f"_no {label.lower()} in this evaluation_", ""]
        for record in chosen:
            body = [record["task"]]
            for turn in record["turns"]:
                # every line of the action quoted, so a multi-line action stays apart from the observation
                action = "\n".join(f"> {line}" for line in turn["action_text"].splitlines() or [""])
                invalid = "" if turn["format_valid"] else f"  [invalid format{': ' + turn['format_reason'] if turn.get('format_reason') else ''}]"
                body += ["", action + invalid, *answer_lines(turn), f"reward {turn['reward']:g}"]
            fence = _fence("\n".join(body))
            lines += [f"## {label}: {record['task_id']}", "", _episode_summary(record), "", fence + "text", *body, fence, ""]
    return "\n".join(lines)


def _fence(text: str) -> str:
    """A code fence longer than any backtick run in ``text`` (model actions may hold code blocks)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _episode_summary(record: dict) -> str:
    outcome = "none (crashed)" if record["outcome"] is None else f"{record['outcome']:g}"
    return (f"task type {record['task_type'] or 'unknown'}, outcome {outcome}, {len(record['turns'])} turns, "
            f"ended: {record['end_reason']}")


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
    eval_md = f"# Evaluation: {title}\n\n{eval_table(evals)}"
    last_eval = last_evaluation(read_metrics(root / "samples.jsonl", "eval"))
    if last_eval:
        (report / "samples.md").write_text(samples_markdown(last_eval))
        eval_md += "\nTranscripts: [samples.md](samples.md)\n"
    (report / "eval.md").write_text(eval_md)
    shutil.copyfile(root / "config.yaml", report / "config.yaml")
    (report / "evaluations.json").write_text(json.dumps(evals, indent=2))
    return report
