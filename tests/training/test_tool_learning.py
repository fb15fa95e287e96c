"""Learning through native tool calls: RL raises held-out success on ``pick_object``'s tool form,
where the answer counts only as a ``take(object=...)`` call written in the tiny model's Hermes
markup (``<tool_call>{"name": "take", "arguments": {"object": "mug"}}</tool_call>``, about 28 tiny
tokens against the text form's two). A bug in rendering the tools, parsing the calls, bridging tool
messages or masking the call ids stops this learning and fails the test.

The warm start is behaviour cloning of the expert's calls run to competence (320 demonstrations x 15
epochs on 1,000 training tasks: about 85% held-out success sampled at temperature 1), and RL and
evaluation sample at temperature 1.5, where its calls fall apart: 66-95% of them are malformed and
it succeeds 1.5-23% of the time (nine runs). RL sharpens exactly that sampled policy; turns that are not a
well-formed call cost 0.5 (``reward.invalid_format_penalty``), as the default run charges malformed
actions.

Why not stop cloning early instead (this test's earlier form, 9 epochs at temperature 1): whether
cloning has built the copy circuit by then is chance. Over seeds 0-4 (2026-12-07, Xeon with AMX,
float32) it left 30%, 11.5%, 20.5%, 77% and 11% and RL gained +18.5, -5.5, +21, -77 and +0.5: two
warm starts ignored the target, which RL does not repair, and the 77% one, nearly deterministic,
broke its own call format at step 346 and never recovered (every call malformed, nothing positive
left to learn from). CI failed on it (+8).

Measured 2026-12-07 (2-core Xeon with AMX; sampled evaluation on 200 held-out tasks): seeds 0-2 in
float32 at 400 steps went 18% -> 76.5%, 17.5% -> 67.5%, 17.5% -> 70.5%; seeds 3-7 with ``dtype:
auto`` (bfloat16 here) at 250 steps gained +48, +51, +43.5, +55.5 and +32.5 (1.5% -> 34%), malformed
calls falling to 11-37% of the warm start's share. At the test's 300 steps seed 0 in float32
went 21.5% -> 73.5% (malformed 71% -> 8%); with lr 1e-9 (a learner that does not learn) 20.5% ->
28% (malformed 70.5% -> 67%), sampling noise. The test asks for +20 points, far above that noise
and below every measured gain, and for malformed calls to halve at least.
"""

from __future__ import annotations

import asyncio

import pytest

from streamrl.training.config_files import load_config
from streamrl.training.loggers import read_metrics
from streamrl.training.loop import train


@pytest.mark.timeout(1200)  # bounded by its 300 steps; the suite's 300 s wall limit is not, on a loaded 2-core machine
def test_rl_through_tool_calls_raises_held_out_success(tmp_path):
    config = load_config("configs/smoke.yaml", [
        "env.name=pick_object", "env.tools=true", "env.train_tasks=1000", "env.eval_tasks=200",
        "sft.source=expert", "sft.demos=320", "sft.epochs=15", "sft.lr=3e-3", "sft.batch_size=8",
        "rollout.max_new_tokens=32", "rollout.concurrency=16", "rollout.max_staleness=1",
        "rollout.temperature=1.5", "eval.temperature=1.5", "eval.greedy=false",
        "train.steps=300", "train.batch_size=16", "train.checkpoint_every=0", "train.seed=0",
        "reward.invalid_format_penalty=0.5", "optim.lr=5e-4", "optim.micro_batch_size=16",
    ], algo="spo++")
    summary = asyncio.run(train(config, tmp_path / "run", echo=lambda *_: None))
    before, after = summary["eval_before"]["success"], summary["eval_after"]["success"]
    assert before < 0.45, f"the warm start should be weak when sampled: {before:.2f}"
    assert after >= before + 0.20, f"no learning through tool calls: held-out success {before:.2f} -> {after:.2f}"
    evals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "eval"]
    malformed_before, malformed_after = evals[0]["format_invalid_frac"], evals[-1]["format_invalid_frac"]
    assert malformed_after <= malformed_before / 2, f"calls stayed malformed: {malformed_before:.2f} -> {malformed_after:.2f}"
