"""The assembled learner moves each trajectory's log-likelihood in the direction of its advantage."""

from __future__ import annotations

import asyncio

import torch

from streamrl.envs import make
from streamrl.policy.hf_engine import HFEngine
from streamrl.policy.loading import load_policy
from streamrl.rollout.play_tasks import run_episodes
from streamrl.training.assemble import make_learner
from streamrl.training.batch import collate
from streamrl.training.evaluate import episode_runner, episode_settings


def _trajectory_logps(learner, batch):
    out = learner.score_batch(learner.model, batch)
    per_token = (out.logprobs * batch.action_mask).sum(dim=1)
    return torch.zeros(len(batch.trajectories)).index_add_(0, batch.sample_trajectory, per_token.float())


def test_spo_plus_plus_step_follows_the_advantage_sign(coin_config):
    config = coin_config("spo++", "optim.lr=3e-3", "train.batch_size=8", "algo.tis_cap=null")
    policy = load_policy("tiny", model_overrides=config.model.overrides, seed=0)

    async def rollouts(seed):
        engine = HFEngine.from_policy(policy, seed=seed)
        try:
            tasks = [f"train/{i}" for i in range(8)]
            return await run_episodes(episode_runner(config, engine, policy, episode_settings(config)),
                                      lambda: make("coin"), tasks, concurrency=8)
        finally:
            await engine.close()

    # 8 coin flips come out all alike 1 time in 128, and which texts are sampled depends on the
    # float summation order (thread count, kernels): take the first engine seed with both outcomes
    for seed in range(1, 6):
        trajectories = asyncio.run(rollouts(seed))
        if 0 < sum(t.outcome or 0.0 for t in trajectories) < len(trajectories):
            break
    learner = make_learner(config, policy)
    source = learner.algorithm.prompt_source([t.prompt_id for t in trajectories])
    for t in trajectories:  # what the dispatcher would have frozen: the unseen prior, 0.5
        t.dispatch = type(t.dispatch)(**{**t.dispatch.to_dict(), "baseline": source.on_dispatch(t.prompt_id).baseline, "z": 0.0})
    batch = collate(trajectories)
    before = _trajectory_logps(learner, batch)
    metrics = learner.step(trajectories)
    after = _trajectory_logps(learner, batch)
    outcomes = batch.outcomes()
    assert 0 < outcomes.sum() < len(outcomes), "need both successes and failures"
    won, lost = outcomes > 0.5, outcomes < 0.5
    assert metrics["trajectories_in_loss"] == 8
    # the engine generated with the very weights the learner scores with: no behaviour drift
    assert 0.0 <= metrics["behaviour_kl"] < 1e-4
    # one step moves the successes up and the failures down on average; a single trajectory may
    # move against its own sign through tokens it shares with others, so the test is on the means
    change = after - before
    assert float(change[won].mean()) > 0.0, (before, after, outcomes)
    assert float(change[lost].mean()) < 0.0, (before, after, outcomes)
    assert int((change[won] > 0).sum()) + int((change[lost] < 0).sum()) >= len(outcomes) - 2, (before, after, outcomes)
