"""Issue 31, in miniature: SmolLM2-135M-Instruct on alfworld_lite's tool form, LoRA, a warm start of
a few demonstrations, two RL steps. The LoRA weights change, and every turn went through the tool
parser. Slow (a few minutes on 2 cores): ``make test-slow``."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from safetensors.torch import load_file

from streamrl.training.config_files import load_config
from streamrl.training.loop import train

pytestmark = pytest.mark.slow


def test_smollm2_tool_form_warm_start_then_rl_changes_the_lora_weights(tmp_path):
    config = load_config("configs/smollm2_alfworld.yaml", [
        "model.init_from=null", "sft.source=expert", "sft.demos=2", "sft.epochs=1", "train.steps=2", "train.batch_size=2", "rollout.concurrency=2",
        "rollout.max_turns=2", "env.eval_tasks=1", "train.checkpoint_every=0", "model.dtype=float32",
        "optim.lr=1e-3",
    ])
    run = tmp_path / "run"
    summary = asyncio.run(train(config, run, echo=lambda *_: None))
    assert summary["steps"] == 2 and summary["model"]["lora"]["r"] == 16
    before = load_file(run / "sft_model" / "adapter_model.safetensors")
    after = load_file(run / "final_model" / "adapter_model.safetensors")
    assert before.keys() == after.keys() and before
    assert any(not torch.equal(before[k], after[k]) for k in before)  # RL moved the adapter
    turns = [turn for line in (run / "samples.jsonl").read_text().splitlines() for turn in json.loads(line)["turns"]]
    assert turns and all(isinstance(turn["tool_calls"], list) for turn in turns)  # read by the tool parser
