"""Behaviour cloning on webshop_lite one epoch at a time, with held-out imitation by action kind.

    python scripts/webshop_sft_probe.py OUT [overrides ...]     # on top of configs/warm_start_webshop.yaml

After each epoch (a fresh ``behaviour_cloning`` call, so Adam restarts) prints the SFT metrics and,
for the held-out demonstrations (``sft.heldout_demos``), how many actions of each kind (search
query, result click (by ASIN or number), option click, buy now) teacher forcing reproduces exactly (every token
p > 0.5), and saves the policy to OUT. docs/webshop.md's tables come from it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from streamrl.envs.webshop_lite import parse_action  # noqa: E402
from streamrl.policy.scoring import forward_for_loss  # noqa: E402
from streamrl.training.batch import collate  # noqa: E402
from streamrl.training.config_files import load_config
from streamrl.training.run import load_run_policy  # noqa: E402
from streamrl.training.sft import behaviour_cloning, demonstrations_and_heldout, exact_actions  # noqa: E402

KINDS = ("search", "result", "option", "buy")


def kind(action: str) -> str:
    name, argument = parse_action(action)
    if name == "search":
        return "search"
    argument = argument or ""
    # a result by its ASIN, or by its number with env.prompt.number_results
    result = argument.startswith("b0") or argument.isdigit()
    return "result" if result else "buy" if argument == "buy now" else "option"


@torch.no_grad()
def exact_by_kind(policy, heldout) -> dict[str, str]:
    hits, total = Counter(), Counter()
    for trajectory in heldout:
        batch = collate([trajectory], pad_id=policy.tokenizer.pad_token_id or 0)
        mask = batch.action_mask.bool()
        logprobs = forward_for_loss(policy.model, batch.input_ids, batch.attention_mask, token_mask=mask,
                                    excluded_ids=policy.banned_token_ids, with_entropy=False).logprobs
        # one per action, rows first (the trajectory's turn order)
        for turn, good in zip(trajectory.turns, exact_actions(logprobs.float(), mask).tolist()):
            total[kind(turn.action)] += 1
            hits[kind(turn.action)] += good
    return {k: f"{hits[k]}/{total[k]}" for k in KINDS}


def main() -> None:
    out, overrides = sys.argv[1], sys.argv[2:]
    config = load_config(["configs/warm_start_webshop.yaml"], overrides)
    policy = load_run_policy(config, None)
    demos, heldout = asyncio.run(demonstrations_and_heldout(config, policy))
    print(f"vocabulary {len(policy.tokenizer)}, {len(demos)} demonstrations, {len(heldout)} held out", flush=True)
    policy.model.eval()
    print("epoch 0", exact_by_kind(policy, heldout), flush=True)
    one_epoch = config.model_copy(update={"sft": config.sft.model_copy(update={"epochs": 1})})
    for epoch in range(1, config.sft.epochs + 1):
        started = time.perf_counter()
        # a new seed each epoch: a new order and, with sft.shuffle_entities, new names (one call
        # of behaviour_cloning seeds both from train.seed)
        seeded = one_epoch.model_copy(update={"train": one_epoch.train.model_copy(update={"seed": config.train.seed + epoch})})
        metrics = behaviour_cloning(seeded, policy, demos, heldout=heldout)
        policy.model.eval()
        print(f"epoch {epoch} ({time.perf_counter() - started:.0f} s)", {k: round(v, 3) for k, v in metrics.items()},
              exact_by_kind(policy, heldout), flush=True)
        policy.save(out)


if __name__ == "__main__":
    main()
