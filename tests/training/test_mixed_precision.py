"""Mixed precision for training: float32 weights, bfloat16 compute (``load_policy(float32_weights=True)``).

Why it exists: with ``dtype: auto`` on a processor with AMX the policy was loaded *and trained* in
bfloat16, and Adam's small steps rounded away: on the ``pick_object`` toy (250 SPO++ steps) pure
bfloat16 gained +3.5 points over three seeds against +22 with float32 weights (docs/results/speed.md).
"""

from __future__ import annotations

import torch

from streamrl.policy.loading import load_policy
from streamrl.policy.scoring import forward_for_loss
from streamrl.training.config_files import load_config
from streamrl.training.optim import adamw
from streamrl.training.run import load_run_policy

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}


def _policy(**kwargs):
    return load_policy("tiny", model_overrides=SMALL, **kwargs)


def test_float32_weights_compute_in_the_asked_dtype():
    policy = _policy(dtype="bfloat16", float32_weights=True)
    assert policy.dtype == torch.float32 and policy.compute_dtype == torch.bfloat16
    assert policy.run_dtype == torch.bfloat16
    assert next(policy.inference_model().parameters()).dtype == torch.bfloat16  # what engines get
    ids = torch.tensor([[1, 5, 9, 12]])
    with policy.autocast():
        logits = policy.model(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16


def test_without_mixed_precision_nothing_changes():
    plain = _policy(dtype="bfloat16")
    assert plain.dtype == torch.bfloat16 and plain.compute_dtype is None
    assert _policy(dtype="float32", float32_weights=True).compute_dtype is None
    lora = _policy(dtype="bfloat16", float32_weights=True, lora={"r": 4, "alpha": 8, "dropout": 0.0,
                                                                  "target_modules": ["q_proj", "v_proj"]})
    assert lora.compute_dtype is None  # the frozen base stays in bfloat16; peft keeps adapters in float32
    with plain.autocast():
        assert not torch.is_autocast_enabled("cpu")


def _changed_fraction(policy, lr: float) -> float:
    """One AdamW step on the NLL of a fixed sequence; the fraction of one layer's weights that moved."""
    torch.manual_seed(0)
    ids = torch.randint(4, 200, (2, 12))
    weight = policy.model.model.layers[0].mlp.down_proj.weight
    before = weight.detach().clone()
    optimizer = adamw(policy.trainable_parameters(), lr=lr)
    with policy.autocast():
        out = forward_for_loss(policy.model, ids, torch.ones_like(ids), with_entropy=False)
    (-out.logprobs.sum()).backward()
    optimizer.step()
    return float((weight.detach() != before).float().mean())


def test_small_steps_reach_float32_weights_and_round_away_in_bfloat16():
    # Adam's first step moves every weight by about lr; bfloat16's spacing at the initial weights'
    # scale (std 0.02) is about 1e-4, so a step of 1e-5 rounds away for all but the smallest
    assert _changed_fraction(_policy(dtype="bfloat16", float32_weights=True), lr=1e-5) > 0.99
    assert _changed_fraction(_policy(dtype="bfloat16"), lr=1e-5) < 0.3  # measured 0.16


def test_training_runs_load_float32_weights():
    config = load_config("configs/smoke.yaml", ["model.dtype=bfloat16", "model.overrides={hidden_size: 64, "
                                                "intermediate_size: 128, num_hidden_layers: 2}"])
    policy = load_run_policy(config, None)
    assert policy.dtype == torch.float32 and policy.compute_dtype == torch.bfloat16
