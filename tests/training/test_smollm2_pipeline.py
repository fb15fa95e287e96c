"""Issue 31, in miniature: SmolLM2-135M-Instruct on alfworld_lite's tool form with LoRA. A few
demonstrations written as native tool calls teach the adapter; two RL steps from the shipped warm
start move it, and the turns went through the tool parser. Slow (a few minutes on 2 cores):
``make test-slow``.

The RL half starts from the shipped warm start, not from the two-demonstration adapter: a model
cloned from two demonstrations calls no tool, so every episode scores the same, every advantage is
zero and the learner rightly skips the update (nothing would be tested)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from safetensors.torch import load_file

from streamrl.policy.loading import shipped_warm_starts
from streamrl.training.config_files import load_config
from streamrl.training.loggers import read_metrics
from streamrl.training.loop import train
from streamrl.training.run import load_run_policy
from streamrl.training.sft import behaviour_cloning, collect_demonstrations

pytestmark = pytest.mark.slow

MINIATURE = ["train.steps=2", "train.batch_size=2", "rollout.concurrency=2", "env.eval_tasks=1",
             "train.checkpoint_every=0", "model.dtype=float32", "optim.lr=1e-3"]


def _lora_b(policy) -> list[torch.Tensor]:
    return [p for name, p in policy.model.named_parameters() if "lora_B" in name]


def test_a_few_tool_call_demonstrations_teach_the_lora():
    config = load_config("configs/smollm2_alfworld.yaml", [
        *MINIATURE, "model.init_from=null", "model.train_top_layers=null", "sft.source=expert", "sft.demos=2",
        "sft.epochs=1", "sft.lr=1e-3",
    ])
    policy = load_run_policy(config, None)
    assert all(not b.any() for b in _lora_b(policy))  # LoRA starts as the identity
    demos = asyncio.run(collect_demonstrations(config, policy))
    assert demos
    calls = [call for demo in demos for turn in demo.turns for call in turn.tool_calls]
    assert calls and all(call["name"] == "execute" for call in calls)  # written, and read back, as tool calls
    behaviour_cloning(config, policy, demos)
    assert any(b.any() for b in _lora_b(policy))


def test_two_rl_steps_from_the_shipped_warm_start_move_the_lora(tmp_path):
    # a small cost per impossible action, so two short episodes that both fail still differ
    config = load_config("configs/smollm2_alfworld.yaml", [*MINIATURE, "rollout.max_turns=3",
                                                           "reward.ineffective_penalty=0.1"])
    run = tmp_path / "run"
    summary = asyncio.run(train(config, run, echo=lambda *_: None))
    assert summary["steps"] == 2 and summary["model"]["lora"]["r"] == 16
    assert any(not row.get("actor_skipped") for row in read_metrics(run / "metrics.jsonl", "train"))
    before = load_file(shipped_warm_starts()["alfworld_lite-smollm2"] / "adapter_model.safetensors")
    after = load_file(run / "final_model" / "adapter_model.safetensors")
    assert before.keys() == after.keys() and before
    assert any(not torch.equal(before[k], after[k]) for k in before)  # RL moved the adapter
    turns = [turn for record in read_metrics(run / "samples.jsonl") for turn in record["turns"]]
    assert turns and all(call["name"] == "execute" for turn in turns for call in turn["tool_calls"])
    assert any(turn["tool_calls"] for turn in turns)  # the warm start calls its tool, read by the parser
