"""Quantised rollouts (issue 36): the engine's projections multiply by int8 copies of the weights,
made again at every ``update_weights``; behaviour log-probs are the quantised policy's, close to the
float policy's; ``model.rollout_dtype`` picks it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from streamrl.policy import GenerationRequest, HFEngine, SamplingParams, load_policy
from streamrl.policy.engines import make_engine
from streamrl.policy.fused_forward import Projection, input_major
from streamrl.training.config import ConfigError
from streamrl.training.config_files import load_config

from .conftest import SMALL_TINY
from .test_engine import prompts, scored_logprobs


def test_an_int8_projection_is_close_to_float_and_follows_its_weight():
    torch.manual_seed(0)
    weight, bias = input_major(torch.randn(96, 64) * 0.05), torch.randn(96) * 0.01
    x = torch.randn(2, 3, 64)
    exact = torch.nn.functional.linear(x, weight, bias)
    quantised = Projection(weight, bias, int8=True)
    assert quantised.quantised is not None
    assert ((quantised(x) - exact).norm() / exact.norm()) < 0.03
    with torch.no_grad():
        weight.mul_(-2.0)  # changed in place, as update_weights does
    quantised.refresh()
    doubled = torch.nn.functional.linear(x, weight, bias)
    assert ((quantised(x) - doubled).norm() / doubled.norm()) < 0.03


def _sampled(engine, policy, count=6, tokens=16):
    requests = [GenerationRequest(f"r{i}", p, SamplingParams(max_new_tokens=tokens, seed=i))
                for i, p in enumerate(prompts(policy, count))]

    async def generate():
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    return [(r.prompt_ids, result) for r, result in zip(requests, asyncio.run(generate()))]


def _logprob_gaps(policy, model, sampled) -> torch.Tensor:
    return torch.cat([torch.tensor(result.logprobs) - scored_logprobs(model, prompt, result.token_ids,
                                                                     policy.banned_token_ids, 1.0)
                      for prompt, result in sampled])


def test_int8_behaviour_logprobs_are_the_quantised_policys_close_to_the_float_ones():
    policy = load_policy(SMALL_TINY, seed=0)
    engine = HFEngine.from_policy(policy, int8=True)
    try:
        gaps = _logprob_gaps(policy, policy.model, _sampled(engine, policy))
    finally:
        engine.close_sync()
    assert gaps.abs().mean() < 0.05  # what the learner's importance weights correct
    assert gaps.abs().max() > 1e-4  # and not the float policy's: quantisation is in effect


def test_int8_weights_are_made_again_at_each_update():
    learner = load_policy(SMALL_TINY, seed=0)
    engine = HFEngine.from_policy(learner, int8=True)
    try:
        torch.manual_seed(1)
        with torch.no_grad():
            for param in learner.model.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        engine.update_weights(learner.state_dict_for_engine(), version=1)
        sampled = _sampled(engine, learner)
    finally:
        engine.close_sync()
    assert all(result.policy_version == 1 for _, result in sampled)
    new_gap = _logprob_gaps(learner, learner.model, sampled).abs().mean()
    old_gap = _logprob_gaps(learner, load_policy(SMALL_TINY, seed=0).model, sampled).abs().mean()
    assert new_gap < 0.05 and old_gap > 4 * new_gap  # the int8 copy follows the new weights, not the old


def test_rollout_dtype_picks_the_engines_weights():
    policy = load_policy(SMALL_TINY, seed=0)
    half = make_engine("hf", policy, rollout_dtype="bfloat16")
    try:
        assert next(half._model.parameters()).dtype == torch.bfloat16
    finally:
        half.close_sync()
    with pytest.raises(ValueError, match="rollout_dtype"):
        make_engine("hf", policy, rollout_dtype="int4")
    assert load_config("configs/smoke.yaml", ["model.rollout_dtype=int8"]).model.rollout_dtype == "int8"
    with pytest.raises(ConfigError, match="model.rollout_dtype: .*int8 rollouts run on the hf engine on a CPU"):
        load_config("configs/smoke.yaml", ["model.device=cuda", "model.rollout_dtype=int8"])


def test_int8_rollouts_of_a_bfloat16_policy_compute_in_float32():
    """``dtype: auto`` gives bfloat16 on AMX machines; fbgemm's int8 linear takes float32 only."""
    policy = load_policy(SMALL_TINY, seed=0, dtype="bfloat16")
    engine = make_engine("hf", policy, rollout_dtype="int8")
    try:
        assert next(engine._model.parameters()).dtype == torch.float32
        sampled = _sampled(engine, policy, count=2, tokens=4)
    finally:
        engine.close_sync()
    assert all(result.error is None and len(result.token_ids) == 4 for _, result in sampled)
