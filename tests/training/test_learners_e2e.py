"""End to end on CPU: every algorithm trains a tiny policy for a few steps and logs what it should."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch

from streamrl.policy.loading import load_policy
from streamrl.training.config import ALGORITHMS
from streamrl.training.loggers import read_metrics
from streamrl.training.loop import train

#: the step's cost too: the learner's time and the wait for the batch (generation it did not hide)
COMMON = ("loss", "policy_loss", "grad_norm", "clip_frac", "ppo_kl", "entropy", "success", "trajectories_consumed",
          "learner_time_s", "batch_wait_s")
SPECIFIC = {
    "spo": ("policy_drift", "rho_mean", "baseline_mean", "baseline_bias"),
    "spo++": ("event_z", "baseline_mean", "baseline_bias", "token_weighted_adv_mean"),
    "grpo": ("frac_degenerate_groups", "n_groups"),
    "ppo": ("critic_loss", "value_mean", "time_critic_update_s"),
    "sapo": ("value_loss", "q_loss", "kl_ref", "value_saturation_frac"),
}


def _weights(folder):
    return {k: v.clone() for k, v in load_policy(folder).model.state_dict().items()}


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_algorithm_trains_and_logs(algo, coin_config, tmp_path):
    config = coin_config(algo, "train.steps=3", "train.checkpoint_every=0")
    summary = asyncio.run(train(config, tmp_path))
    train_records = read_metrics(tmp_path / "metrics.jsonl", "train")
    assert [r["step"] for r in train_records] == [1, 2, 3]
    # a step whose advantages are all 0 (e.g. every GRPO group won or lost alike) skips the update
    updated = [r for r in train_records if not (r.get("actor_skipped") or r.get("skipped"))]
    assert updated, f"{algo}: every step skipped its update"
    for record in updated:
        for key in COMMON + SPECIFIC[algo]:
            assert key in record, f"{algo}: metric {key} missing"
            assert record[key] is not None and math.isfinite(record[key]), f"{algo}: {key}={record[key]}"
        if "baseline_bias" in record and record["trajectories_in_loss"] == record["trajectories"]:
            # the coin's outcomes are unshaped: the bias is the baselines' mean minus the batch's success
            assert record["baseline_bias"] == pytest.approx(record["baseline_mean"] - record["outcome_mean"])
    assert summary["eval_after"]["episodes"] == 4

    start = load_policy("tiny", model_overrides=config.model.overrides, seed=config.train.seed).model.state_dict()
    final = _weights(tmp_path / "final_model")
    changed = [k for k in final if not torch.equal(final[k], start[k])]
    assert changed, f"{algo}: no weight changed"


def test_spo_plus_plus_tracker_follows_the_event_clock(coin_config, tmp_path):
    config = coin_config("spo++", "train.steps=3", "train.checkpoint_every=3")
    asyncio.run(train(config, tmp_path))
    state = json.loads(next((tmp_path / "checkpoints").glob("step_*/state.json")).read_text())
    tracker = state["learner"]["tracker"]
    assert tracker["z"] == pytest.approx(3 * -math.log(0.875))
    # every result that arrived (delivered or still buffered) left evidence once, keyed by request id
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    results = {e["request_id"] for e in events if e["event"] == "result"}
    seen = tracker["seen_request_ids"]
    assert set(seen) <= results and len(seen) == len(set(seen)) >= 3 * config.train.batch_size


def test_spo_tracker_absorbs_every_delivered_result(coin_config, tmp_path):
    config = coin_config("spo", "train.steps=2", "train.checkpoint_every=2")
    asyncio.run(train(config, tmp_path))
    state = json.loads(next((tmp_path / "checkpoints").glob("step_*/state.json")).read_text())
    visits = sum(entry[3] for entry in state["learner"]["tracker"]["prompts"])
    assert visits == 2 * config.train.batch_size


def test_offline_prior_initialises_the_tracker_from_initial_rollouts(coin_config, tmp_path):
    config = coin_config("spo++", "train.steps=1", "train.checkpoint_every=1", "algo.offline_samples=2", "env.train_tasks=4")
    asyncio.run(train(config, tmp_path))
    state = json.loads(next((tmp_path / "checkpoints").glob("step_*/state.json")).read_text())
    prompts = {entry[0]: entry for entry in state["learner"]["tracker"]["prompts"]}
    assert set(prompts) == {f"train/{i}" for i in range(4)}
    # an offline prior has N0 = 1 / (1 - 0.875) = 8 pseudo-counts (the unseen prior has 1, and one
    # step adds at most a few results per prompt), decayed by at most one publish
    assert all(a + b > 4.0 for _, a, b, _ in prompts.values())
