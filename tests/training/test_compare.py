"""The comparison harness: statistics on known curves, and resuming without rerunning."""

from __future__ import annotations

import json

import pytest

from streamrl.training import compare
from streamrl.training.compare import CompareConfig, plan_runs, write_comparison_report


def _spec(**extra):
    fields = {"name": "t", "base": ["configs/smoke.yaml"], "seeds": [0, 1, 2],
              "arms": {"a": {"algo": "spo++"}, "b": {"algo": "spo"}}, "pairs": [("a", "b")]}
    return CompareConfig(**{**fields, **extra})


def _fake_run(folder, xs, ys, score=None):
    folder.mkdir(parents=True)
    lines = [json.dumps({"kind": "train", "step": i + 1, "trajectories_consumed": x, "success": y, "ppo_kl": 0.01})
             for i, (x, y) in enumerate(zip(xs, ys))]
    score = ys[-1] if score is None else score
    lines.append(json.dumps({"kind": "eval", "step": len(xs), "success": ys[-1], "score": score}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_report_statistics_on_known_curves(tmp_path):
    spec = _spec()
    runs = []
    for seed, offset in zip(spec.seeds, (0.0, 0.1, 0.2)):
        _fake_run(tmp_path / f"a{seed}", [0, 10, 20], [0.0, 0.5, 1.0])  # ramp: AUC 0.5
        _fake_run(tmp_path / f"b{seed}", [0, 5, 20], [offset] * 3)  # constant: AUC = offset
        runs += [("a", seed, tmp_path / f"a{seed}"), ("b", seed, tmp_path / f"b{seed}")]
    for seed in spec.seeds:  # the shared warm starts' held-out success: the "before" of every arm
        (tmp_path / "warm_start" / f"seed_{seed}").mkdir(parents=True)
        (tmp_path / "warm_start" / f"seed_{seed}" / "eval.json").write_text(json.dumps({"success": 0.1 * seed}))
    write_comparison_report(spec, tmp_path, runs)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["arms"]["a"]["eval_before_mean"] == pytest.approx(0.1)
    assert report["arms"]["a"]["auc_mean"] == pytest.approx(0.5)
    assert report["arms"]["b"]["auc_mean"] == pytest.approx(0.1)
    pair = report["pairs"][0]["auc_points"]
    # differences 50, 40, 30 points: mean 40, sd 10, t(0.975, 2) = 4.303
    assert pair["mean"] == pytest.approx(40.0)
    assert pair["sd"] == pytest.approx(10.0)
    assert pair["ci_high"] - pair["mean"] == pytest.approx(4.302653 * 10 / 3**0.5, rel=1e-4)
    assert report["pairs"][0]["final_points"]["mean"] == pytest.approx(100 * 0.5 - 10, rel=1e-6)
    assert (tmp_path / "curves.png").stat().st_size > 0
    # held-out success after training: 100 against 0, 10, 20 points
    assert report["pairs"][0]["held_out_points"]["mean"] == pytest.approx(90.0)
    assert "| a − b | 3 | +40.0 ± 10.0 [+15.2, +64.8] |" in (tmp_path / "report.md").read_text()


def test_a_graded_score_gets_its_own_columns_and_paired_difference(tmp_path):
    spec = _spec()
    runs = []
    for seed in spec.seeds:
        _fake_run(tmp_path / f"a{seed}", [0, 10], [0.2, 0.4], score=0.60 + seed / 100)  # WebShop-like: score > success
        _fake_run(tmp_path / f"b{seed}", [0, 10], [0.2, 0.2], score=0.50)
        runs += [("a", seed, tmp_path / f"a{seed}"), ("b", seed, tmp_path / f"b{seed}")]
    write_comparison_report(spec, tmp_path, runs)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["arms"]["a"]["score_after_mean"] == pytest.approx(0.61)
    assert report["pairs"][0]["score_points"]["mean"] == pytest.approx(11.0)
    text = (tmp_path / "report.md").read_text()
    assert "held-out score after |" in text and "| +11.0 ± 1.0 [" in text
    # a 0/1 reward's score is its success: no extra column (the known-curves report above)
    runs_binary = tmp_path / "binary"
    for seed in spec.seeds:
        _fake_run(runs_binary / f"a{seed}", [0, 10], [0.2, 0.4])
        _fake_run(runs_binary / f"b{seed}", [0, 10], [0.2, 0.2])
    write_comparison_report(spec, runs_binary, [(arm, seed, runs_binary / f"{arm}{seed}") for arm in "ab" for seed in spec.seeds])
    assert "score" not in (runs_binary / "report.md").read_text()


def _recorded(spec, tmp_path, monkeypatch):
    """``spec`` written as a comparison file, with its commands recorded instead of run."""
    calls = []
    monkeypatch.setattr(compare, "_run", lambda command, log: calls.append(command))
    monkeypatch.setattr(compare, "write_comparison_report", lambda spec, out, runs: out / "report.md")
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(spec.model_dump(mode="json")))
    return calls, config


def test_finished_runs_are_not_rerun_and_interrupted_ones_resume(tmp_path, monkeypatch):
    spec = _spec(seeds=[0])
    warm, runs = plan_runs(spec, tmp_path)
    assert len(warm) == 1 and len(runs) == 2
    assert all(any(arg.startswith("model.init_from=") for arg in command) for _, _, command, _ in runs)
    (runs[0][3]).mkdir(parents=True)
    (runs[0][3] / "summary.json").write_text("{}")  # arm a finished
    (runs[1][3] / "checkpoints").mkdir(parents=True)  # arm b was interrupted
    warm_folder = warm[0][3]
    (warm_folder / "sft_model").mkdir(parents=True)
    (warm_folder / "sft_model" / "config.json").write_text("{}")  # warm start trained, not yet evaluated
    calls, config = _recorded(spec, tmp_path, monkeypatch)
    compare.run_comparison(config, out=tmp_path)
    assert len(calls) == 2
    assert calls[0][3] == "eval" and str(warm_folder / "eval.json") in calls[0]
    assert "--resume" in calls[1] and "spo" in calls[1]
    (warm_folder / "eval.json").write_text('{"success": 0.25}')
    (runs[1][3] / "summary.json").write_text("{}")
    calls.clear()
    compare.run_comparison(config, out=tmp_path)
    assert calls == []  # everything done: only the report is rewritten


def test_runs_from_the_configs_own_start_evaluate_it_once(tmp_path, monkeypatch):
    spec = _spec(shared_warm_start=False)
    warm, runs = plan_runs(spec, tmp_path)
    (seed, sft, evaluation, folder), = warm  # no SFT, one evaluation for every seed and arm
    assert seed is None and sft is None and evaluation[0] == "eval" and folder == tmp_path / "start"
    assert len(runs) == 6 and not any(arg.startswith("model.init_from=") for _, _, command, _ in runs for arg in command)
    calls, config = _recorded(spec, tmp_path, monkeypatch)
    compare.run_comparison(config, out=tmp_path)
    assert [c[3] for c in calls] == ["eval"] + ["train"] * 6
    # the report's "before" of every run is that evaluation
    for _, seed, _, folder in runs:
        _fake_run(folder, [0, 10], [0.2, 0.4])
    (tmp_path / "start").mkdir()
    (tmp_path / "start" / "eval.json").write_text('{"success": 0.3}')
    write_comparison_report(spec, tmp_path, [(name, seed, folder) for name, seed, _, folder in runs])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["arms"]["a"]["eval_before_mean"] == report["arms"]["b"]["eval_before_mean"] == pytest.approx(0.3)


def test_bad_comparison_files_are_reported(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nbase: [a.yaml]\nseeds: [0]\narms: {a: {algo: spo}, b: {algo: a2c}}\n")
    with pytest.raises(compare.ConfigError, match="unknown algorithm 'a2c'"):
        compare.load_compare_config(path)
