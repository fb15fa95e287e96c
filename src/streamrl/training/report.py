"""The report folder written at the end of a run: ``index.md`` (a summary that links the rest), the
learning curve and the training diagnostics as PNGs, evaluation tables, transcripts of the last
evaluation, config."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

from streamrl.training.config import Config
from streamrl.training.loggers import read_metrics
from streamrl.training.samples import answer_lines

#: transcripts of each kind (success, failure) shown in report/samples.md
SHOWN_PER_KIND = 3


def eval_table(records: list[dict]) -> str:
    """Markdown: one column per evaluation (policy version), one row per task type."""
    if not records:
        return "_no evaluation was run_\n"
    types = sorted({k.split("/", 1)[1] for r in records for k in r if k.startswith("success/")})
    header = "| task type | " + " | ".join(_column(r) for r in records) + " |"
    lines = [header, "|---" * (len(records) + 1) + "|"]
    for task_type in types:
        cells = [f"{100 * r[f'success/{task_type}']:.1f}" if f"success/{task_type}" in r else "-" for r in records]
        lines.append(f"| {task_type} | " + " | ".join(cells) + " |")
    lines.append("| **all** | " + " | ".join(f"**{100 * r['success']:.1f}**" for r in records) + " |")
    lines.append("| episodes | " + " | ".join(str(r["episodes"]) for r in records) + " |")
    return "\n".join(lines) + "\n"


def _column(record: dict) -> str:
    """An evaluation's column: the model it evaluated when it names one (``streamrl eval``), else the
    policy version and step of the run."""
    if record.get("model"):
        return str(record["model"])
    return f"v{record['policy_version']} (step {record['step']})"


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
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        x = [r.get("trajectories_consumed", r["step"]) for r in train]
        y = [r.get("success", 0.0) for r in train]
        ax.plot(x, y, alpha=0.35, label="training success (per batch)", marker="o" if len(y) < 10 else None, markersize=3)
        window = max(1, len(y) // 10)
        smooth = [sum(y[max(0, i - window + 1) : i + 1]) / len(y[max(0, i - window + 1) : i + 1]) for i in range(len(y))]
        ax.plot(x, smooth, label=f"training success (mean of {window})")
    if evals:
        by_step = {r["step"]: r for r in evals}
        steps = sorted(by_step)
        lookup = {r["step"]: r.get("trajectories_consumed", r["step"]) for r in train}
        x = [lookup.get(s, 0) for s in steps]
        y = [by_step[s]["success"] for s in steps]
        bounds = [wilson_interval(by_step[s]["success"] * by_step[s]["episodes"], by_step[s]["episodes"]) for s in steps]
        errors = [[v - low for v, (low, _) in zip(y, bounds)], [high - v for v, (_, high) in zip(y, bounds)]]
        ax.errorbar(x, y, yerr=errors, fmt="o-", capsize=3, label="held-out success (95% interval)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trajectories consumed")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: the diagnostics figure: (metric keys plotted together, panel title, what the panel is for)
DIAGNOSTICS = (
    (("loss", "policy_loss"), "loss", "the optimised objective; spikes point at a bad batch"),
    (("ppo_kl", "behaviour_kl"), "policy drift (KL)", "how far an update moves the policy, and engine/trainer mismatch"),
    (("clip_frac", "dual_clip_frac"), "clipped tokens", "the share of tokens whose ratio hit the trust region"),
    (("entropy",), "entropy", "exploration left; a fall to 0 is collapse"),
    (("grad_norm",), "gradient norm", "before clipping (optim.grad_clip)"),
    (("turns_mean", "action_tokens_mean"), "episode length", "turns and generated tokens per episode"),
    (("format_invalid_frac", "frac_zero_adv"), "malformed / no signal", "malformed turns; episodes with zero advantage"),
    (("rollout_slot_utilisation", "lag_mean"), "rollout", "busy rollout slots; policy versions behind"),
)


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial proportion (sound near 0 and 1, unlike the normal one)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def plot_diagnostics(train: list[dict], path: Path, title: str) -> list[str]:
    """One panel per ``DIAGNOSTICS`` entry that the metrics hold; returns the panels drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(keys, name) for keys, name, _ in DIAGNOSTICS if any(k in r for r in train for k in keys)]
    if not panels:
        return []
    columns = 2
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(10, 2.4 * rows), squeeze=False)
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    for ax, (keys, name) in zip(axes.flat, panels):
        drawn = False
        for key in keys:
            points = [(r["step"], r[key]) for r in train if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if points:  # few points: markers, or a single one would draw nothing
                ax.plot(*zip(*points), label=key, linewidth=1, marker="o" if len(points) < 10 else None, markersize=3)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no data in this run", ha="center", va="center", transform=ax.transAxes, fontsize=8, alpha=0.6)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
        ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))  # 7.6133, never "1e-7+7.613301"
        if drawn:
            ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("learner step")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [name for _, name in panels]


def summary_paragraph(config: Config, summary: dict[str, Any], evals: list[dict]) -> str:
    """What was trained, how held-out success moved (with 95% intervals), how long it took, and any warning."""
    model = summary.get("model") or {"spec": config.model.spec, "init_from": config.model.init_from}
    start = f", starting from {model['init_from']}" if model.get("init_from") else ""
    size = f" ({model['parameters'] / 1e6:.1f}M parameters)" if model.get("parameters") else ""
    parts = [f"{config.algo.name} trained {model['spec']}{size}{start} on {config.task_label()} for "
             f"{summary.get('steps', 0)} steps ({summary.get('trajectories', 0):.0f} trajectories)"]
    if summary.get("wall_s") is not None:
        wall = summary["wall_s"]
        took = f"{wall:.0f} s" if wall < 120 else f"{wall / 60:.1f} min"
        parts[0] += f" in {took} on {summary.get('processor', 'this machine')}"
    if evals:
        shown = []
        for record in (evals[0], evals[-1]) if len(evals) > 1 else (evals[0],):
            low, high = wilson_interval(record["success"] * record["episodes"], record["episodes"])
            shown.append(f"{100 * record['success']:.1f}% [{100 * low:.1f}, {100 * high:.1f}] at step {record['step']}")
        parts.append("held-out success " + " -> ".join(shown) + f" ({evals[-1]['episodes']} episodes, 95% intervals)")
    for warning in summary.get("warnings") or []:
        parts.append(f"**warning**: {warning}")
    for line in ("crashes", "baselines"):
        if summary.get(line):
            parts.append(summary[line])
    return ". ".join(parts) + "."


def crash_summary(events_path: Path) -> str | None:
    """How many training episodes crashed, by end reason, and the most frequent error text."""
    from collections import Counter

    from streamrl.rollout import read_events

    if not events_path.is_file():
        return None
    crashed = [e for e in read_events(events_path) if e.get("event") == "result" and e.get("outcome") is None]
    if not crashed:
        return None
    reasons = Counter(e.get("end_reason") for e in crashed)
    messages = Counter(e.get("error") for e in crashed if e.get("error"))
    line = f"{len(crashed)} training episodes crashed ({', '.join(f'{r}: {n}' for r, n in reasons.most_common())})"
    if messages:
        message, count = messages.most_common(1)[0]
        line += f"; most often ({count}x): `{message}`"
    return line


def baseline_summary(events_path: Path, reward_range: tuple[float, float], scale: float = 1.0,
                     window: int = 2) -> str | None:
    """How close the baselines frozen at dispatch (SPO++'s event-time memory) came to their tasks'
    success rates, graded by the run's own evidence (``algos/baseline_accuracy.py``); None when the
    run froze none. Outcomes are in the environment's ``reward_range``, baselines ``scale`` times it."""
    from streamrl.algos.baseline_accuracy import baseline_accuracy
    from streamrl.rollout import read_events

    if not events_path.is_file():
        return None
    events = read_events(events_path)
    frozen = {e["request_id"]: e for e in events if e.get("event") == "dispatch" and e.get("baseline") is not None}
    graded = [(frozen[e["request_id"]], e) for e in events
              if e.get("event") == "result" and e.get("outcome") is not None and e["request_id"] in frozen]
    if not graded:
        return None
    low, high = reward_range

    def unit(value: float) -> float:
        return min(max((value - low) / (high - low), 0.0), 1.0)

    accuracy = baseline_accuracy([d["prompt_id"] for d, _ in graded], [d["policy_version"] for d, _ in graded],
                                 [unit(d["baseline"] / scale) for d, _ in graded], [unit(r["outcome"]) for _, r in graded],
                                 window=window)
    if not accuracy.episodes:
        return None
    return (f"frozen baselines against the run's own evidence (same task, snapshots within {window} versions): "
            f"bias {accuracy.bias:+.3f}, mean |error| {accuracy.mean_abs:.3f} over {accuracy.episodes} episodes "
            f"({accuracy.ungraded} without evidence)")


def write_report(root: Path, config: Config, summary: dict[str, Any] | None = None,
                 reward_range: tuple[float, float] = (0.0, 1.0)) -> Path:
    """The run's report folder; ``reward_range``: the environment's (the baselines' diagnostic reads it)."""
    report = root / "report"
    report.mkdir(exist_ok=True)
    metrics = read_metrics(root / "metrics.jsonl")
    train = [r for r in metrics if r["kind"] == "train"]
    evals = [r for r in metrics if r["kind"] == "eval"]
    summary = {**(summary or {}), "crashes": crash_summary(root / "events.jsonl"),
               "baselines": baseline_summary(root / "events.jsonl", reward_range, config.reward.scale)}
    model = summary.get("model") or {}
    title = f"{config.algo.name} on {config.task_label()} ({model.get('spec', config.model.spec)})"
    plot_learning_curve(train, evals, report / "learning_curve.png", title)
    panels = plot_diagnostics(train, report / "diagnostics.png", title)
    eval_md = f"# Evaluation: {title}\n\n{eval_table(evals)}"
    last_eval = last_evaluation(read_metrics(root / "samples.jsonl", "eval"))
    if last_eval:
        (report / "samples.md").write_text(samples_markdown(last_eval))
        eval_md += "\nTranscripts: [samples.md](samples.md)\n"
    (report / "eval.md").write_text(eval_md)
    shutil.copyfile(root / "config.yaml", report / "config.yaml")
    (report / "evaluations.json").write_text(json.dumps(evals, indent=2))
    index = [f"# {title}", "", summary_paragraph(config, summary, evals), "",
             "![learning curve](learning_curve.png)", "",
             "Training success per batch and held-out success with 95% Wilson intervals.", ""]
    if panels:
        index += ["![diagnostics](diagnostics.png)", "",
                  *[f"- **{name}**: {why}" for _, name, why in DIAGNOSTICS if name in panels], ""]
    index += ["- [eval.md](eval.md): held-out success by task type at each evaluation",
              *(["- [samples.md](samples.md): transcripts of successes and failures"] if last_eval else []),
              "- [config.yaml](config.yaml): the configuration that ran", ""]
    (report / "index.md").write_text("\n".join(index))
    return report
