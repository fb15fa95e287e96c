"""With ``model.train_top_layers``, the learner takes the inputs of its lowest trained block from
the engine's trajectories: a step from them updates the policy as the full forward does, in both
layouts, and the inputs stay valid across versions (every block below is frozen)."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from streamrl.envs import make
from streamrl.policy import GenerationRequest, SamplingParams
from streamrl.policy.engines import make_engine
from streamrl.policy.loading import load_policy
from streamrl.rollout.play_tasks import run_episodes
from streamrl.training.assemble import make_learner
from streamrl.training.evaluate import episode_runner, episode_settings

TINY = "tiny:hidden=64,layers=4,heads=4,kv_heads=2,intermediate=128"


async def _episodes(config, policy, engine):
    trajectories = await run_episodes(episode_runner(config, engine, policy, episode_settings(config)),
                                      lambda: make("coin"), [f"train/{i}" for i in range(8)], concurrency=8)
    for t in trajectories:  # what the dispatcher would have frozen: the unseen prior
        t.dispatch = type(t.dispatch)(**{**t.dispatch.to_dict(), "baseline": 0.5, "z": 0.0})
    return trajectories


def _play(config, policy, capture_layer):
    async def run():
        engine = make_engine("hf", policy, seed=1, capture_layer=capture_layer)
        try:
            return await _episodes(config, policy, engine)
        finally:
            await engine.close()

    return asyncio.run(run())


@pytest.mark.parametrize("layout", ["full_history", "per_step"])
def test_a_step_from_engine_block_inputs_equals_the_full_forward_step(coin_config, layout):
    # a large AdamW epsilon: at the first step Adam moves every weight by about +-lr whatever its
    # gradient's size, so a gradient of ~1e-9 that rounds to the other sign in one path (thread
    # counts under load) would differ by 2 lr; with eps 1e-3 the update follows the gradient itself
    config = coin_config("spo++", f"rollout.layout={layout}", "model.train_top_layers=2", "algo.tis_cap=null",
                         "model.lora={r: 4}", "optim.eps=1e-3")
    policy = load_policy(TINY, seed=0, lora={"r": 4})
    twin = copy.deepcopy(policy)
    reusing, full = make_learner(config, policy), make_learner(config, twin)
    assert reusing.reused_block == 2
    trajectories = _play(config, policy, capture_layer=2)
    assert all(t.block_inputs is not None and t.block_inputs_layer == 2 for t in trajectories)
    assert all(len(t.block_inputs) == (1 if layout == "full_history" else len(t.turns)) for t in trajectories)
    stripped = copy.deepcopy(trajectories)
    for t in stripped:
        t.block_inputs = t.block_inputs_layer = None
    metrics = reusing.step(trajectories)
    reference = full.step(stripped)
    assert metrics["block_inputs_reused"] == 1.0 and reference["block_inputs_reused"] == 0.0
    assert "actor_skipped" not in metrics
    assert metrics["policy_loss"] == pytest.approx(reference["policy_loss"], abs=1e-5)
    initial = dict(load_policy(TINY, seed=0, lora={"r": 4}).model.named_parameters())
    trained = {k: p for k, p in twin.model.named_parameters() if p.requires_grad}
    for key, parameter in policy.model.named_parameters():
        if key in trained:
            assert torch.allclose(parameter, trained[key], atol=1e-6), key
    assert any(not torch.equal(trained[key], initial[key]) for key in trained)


def test_block_inputs_are_the_same_at_every_version(coin_config):
    """The blocks below the trained ones are frozen: after a learner step and a weight update the
    engine computes the same inputs of the lowest trained block for the same ids."""
    config = coin_config("spo++", "model.train_top_layers=2", "algo.tis_cap=null", "optim.lr=1e-2")
    policy = load_policy(TINY, seed=0, lora={"r": 4})
    learner = make_learner(config, policy)
    prompt = policy.encode_chat([{"role": "user", "content": "Flip."}])

    async def generate(engine, version):
        result = await engine.generate(GenerationRequest(f"v{version}", prompt, SamplingParams(temperature=0.0, max_new_tokens=4)))
        return result.block_inputs[: len(prompt)]

    async def main():
        engine = make_engine("hf", policy, seed=1, capture_layer=2)
        try:
            before = await generate(engine, 0)
            trajectories = await _episodes(config, policy, engine)
            head_before = {k: p.clone() for k, p in policy.model.named_parameters() if p.requires_grad}
            await asyncio.to_thread(learner.step, trajectories)
            assert any(not torch.equal(p, head_before[k]) for k, p in policy.model.named_parameters() if k in head_before)
            engine.update_weights(policy.state_dict_for_engine(), 1)
            after = await generate(engine, 1)
        finally:
            await engine.close()
        return before, after

    before, after = asyncio.run(main())
    assert torch.allclose(before, after, atol=1e-6)


@pytest.mark.parametrize(("overrides", "reused", "line"), [
    (("model.train_top_layers=1",), 1.0, "learner: runs blocks 1+ only, from the engine's inputs of block 1"),
    (("model.train_top_layers=1", "model.rollout_dtype=bfloat16"), 0.0,
     "learner: runs every block (model.rollout_dtype=bfloat16 computes other hidden states than the learner's blocks)"),
])
def test_the_loop_hands_block_inputs_over_and_says_which_path(coin_config, tmp_path, overrides, reused, line):
    from streamrl.training.loggers import read_metrics
    from streamrl.training.loop import train

    config = coin_config("spo++", "train.steps=2", "train.checkpoint_every=0", *overrides)
    said: list[str] = []
    asyncio.run(train(config, tmp_path, echo=said.append))
    assert line in said
    records = read_metrics(tmp_path / "metrics.jsonl", "train")
    stepped = [r for r in records if not r.get("skipped")]  # a step with no usable episode collates nothing
    assert stepped and all(r["block_inputs_reused"] == reused for r in stepped)
    assert all(r["peak_rss_gb"] > 0 for r in records)
