"""Behaviour cloning: what ``sft.prompt_loss_weight`` adds to the action loss."""

from __future__ import annotations

import asyncio

import pytest
import torch

from streamrl.policy.scoring import forward_for_loss
from streamrl.training.batch import collate
from streamrl.training.config_files import load_config
from streamrl.training.run import load_run_policy, policy_source
from streamrl.training.sft import (
    behaviour_cloning,
    collect_demonstrations,
    entity_token_ids,
    imitation,
    shuffle_entities,
)


def _cloned(prompt_loss_weight: float):
    config = load_config("configs/smoke.yaml", [
        "env.name=pick_object", "env.prompt={}", "env.parser={}", "sft.source=expert", "sft.demos=16",
        "sft.epochs=4", "sft.lr=3e-3", "sft.batch_size=4", f"sft.prompt_loss_weight={prompt_loss_weight}",
        "model.dtype=float32",
    ])
    torch.manual_seed(0)
    policy = load_run_policy(config, None)
    demos = asyncio.run(collect_demonstrations(config, policy))
    before = _mean_nll(policy, demos)
    metrics = behaviour_cloning(config, policy, demos)
    return before, _mean_nll(policy, demos), metrics


def _mean_nll(policy, demos) -> tuple[float, float]:
    """(prompt-token NLL, action-token NLL) of the demonstrations."""
    batch = collate(demos, pad_id=policy.tokenizer.pad_token_id or 0)
    with torch.no_grad():
        out = forward_for_loss(policy.model, batch.input_ids, batch.attention_mask, with_entropy=False)
    scored = batch.attention_mask.bool().clone()
    scored[:, 1:] &= batch.attention_mask[:, :-1].bool()
    scored[:, 0] = False
    action = batch.action_mask.bool()
    prompt = scored & ~action
    return float(-out.logprobs[prompt].mean()), float(-out.logprobs[action].mean())


def test_prompt_loss_weight_trains_the_prompt_tokens_too():
    (prompt0, action0), (prompt_plain, action_plain), plain = _cloned(0.0)
    (_, _), (prompt_both, action_both), both = _cloned(1.0)
    # both learn the demonstrated actions; the metrics report the action loss only
    assert action_plain < action0 - 1.0 and action_both < action0 - 1.0
    assert abs(plain["nll"] - action_plain) < 1.0 and abs(both["nll"] - action_both) < 1.0
    # only the weighted run is taught to predict the pages it read
    assert prompt_both < prompt0 - 1.0
    assert prompt_both < prompt_plain - 0.5


def _exact_by_hand(policy, demos) -> float:
    """Per action (a run of action tokens), is every token's p > 0.5? Plain loops."""
    batch = collate(demos, pad_id=policy.tokenizer.pad_token_id or 0)
    with torch.no_grad():
        out = forward_for_loss(policy.model, batch.input_ids, batch.attention_mask, with_entropy=False)
    results = []
    for row in range(batch.num_rows):
        mask = batch.action_mask[row].tolist()
        run: list[bool] = []
        for t, inside in enumerate(mask + [False]):
            if inside:
                run.append(float(out.logprobs[row, t]) > -0.693)
            elif run:
                results.append(all(run))
                run = []
    return sum(results) / len(results)


def test_heldout_demonstrations_are_unseen_goals_and_imitation_counts_actions():
    config = load_config("configs/smoke.yaml", [
        "env.name=pick_object", "env.prompt={}", "env.parser={}", "sft.source=expert", "sft.demos=16",
        "sft.epochs=25", "sft.lr=3e-3", "sft.batch_size=4", "sft.heldout_demos=12", "model.dtype=float32",
    ])
    torch.manual_seed(0)
    policy = load_run_policy(config, None)
    demos = asyncio.run(collect_demonstrations(config, policy))
    heldout = asyncio.run(collect_demonstrations(config, policy, heldout=True))
    assert len(heldout) == 12 and not {t.dispatch.prompt_id for t in heldout} & {t.dispatch.prompt_id for t in demos}
    assert all(t.dispatch.prompt_id.startswith("test/") for t in heldout)
    before = imitation(policy, demos)
    metrics = behaviour_cloning(config, policy, demos, heldout=heldout)
    after = imitation(policy, demos)
    # the same count as plain loops (one action of slack: the two forwards batch differently)
    assert abs(after["action_exact"] - _exact_by_hand(policy, demos)) <= 1 / len(demos)
    assert after["action_exact"] > before["action_exact"] + 0.5  # measured 0.0 -> 0.94
    assert metrics["heldout_action_exact"] == imitation(policy, heldout)["action_exact"]
    assert metrics["heldout_nll"] == imitation(policy, heldout)["nll"]
    assert after["nll"] < before["nll"]
    assert asyncio.run(collect_demonstrations(config.model_copy(update={"sft": config.sft.model_copy(
        update={"heldout_demos": 0})}), policy, heldout=True)) == []


def test_shuffle_entities_renames_each_entity_consistently_within_a_row():
    entity_ids = torch.arange(100, 140)
    input_ids = torch.tensor([
        [1, 101, 2, 105, 101, 3, 105, 7],
        [4, 5, 6, 7, 8, 9, 10, 11],  # no entities: untouched
        [101, 101, 101, 2, 120, 3, 139, 0],
    ])
    generator = torch.Generator().manual_seed(0)
    renamings = []
    for _ in range(50):
        out = shuffle_entities(input_ids, entity_ids, generator)
        is_entity = torch.isin(input_ids, entity_ids)
        assert torch.equal(out[~is_entity], input_ids[~is_entity])
        assert torch.isin(out[is_entity], entity_ids).all()
        for row in range(input_ids.shape[0]):
            pairs = set(zip(input_ids[row][is_entity[row]].tolist(), out[row][is_entity[row]].tolist()))
            olds, news = [a for a, _ in pairs], [b for _, b in pairs]
            assert len(set(olds)) == len(pairs) == len(set(news))  # a bijection between the row's entities
        renamings.append(tuple(out[0].tolist()))
    assert len(set(renamings)) > 40  # fresh names each time, not a fixed relabelling
    again = shuffle_entities(input_ids, entity_ids, torch.Generator().manual_seed(0))
    assert torch.equal(again, shuffle_entities(input_ids, entity_ids, torch.Generator().manual_seed(0)))


def test_shuffle_entities_needs_the_entities_as_single_tokens():
    config = load_config("configs/warm_start_webshop.yaml", ["sft.shuffle_entities=true"])
    from streamrl.policy.tiny import load_tiny_tokenizer

    with pytest.raises(ValueError, match="no single token for 3900 entities .*model.entity_tokens=true"):
        entity_token_ids(config, load_tiny_tokenizer())
    asins = policy_source(config.model_copy(update={"model": config.model.model_copy(update={"entity_tokens": True})}))
    tokenizer = load_tiny_tokenizer(asins["entity_tokens"])
    ids = entity_token_ids(config, tokenizer)
    assert ids.tolist() == list(range(len(tokenizer) - 3900, len(tokenizer)))


def test_webshop_demonstrations_are_written_as_the_prompt_shows_results():
    """With ``env.prompt.number_results`` the shopper's ASIN clicks become ``click[k]`` in the
    demonstration, the number the prompt shows, and the episodes still buy what the shopper chose."""
    overrides = ["sft.source=search_expert", "sft.demos=3", "sft.only_successes=false", "model.dtype=float32"]
    config = load_config("configs/warm_start_webshop.yaml", [*overrides, "env.prompt.number_results=false"])
    numbered = load_config("configs/warm_start_webshop.yaml", [*overrides, "env.prompt.number_results=true"])
    policy = load_run_policy(config, None)
    plain = asyncio.run(collect_demonstrations(config, policy))
    by_number = asyncio.run(collect_demonstrations(numbered, policy))
    assert [t.won for t in by_number] == [t.won for t in plain] and any(t.won for t in plain)
    clicks = 0
    for a, b in zip(plain, by_number):
        assert [t.info.get("purchased_asin") for t in a.turns] == [t.info.get("purchased_asin") for t in b.turns]
        for turn_a, turn_b in zip(a.turns, b.turns):
            if turn_a.action.startswith("click[b0"):
                clicks += 1
                assert turn_b.action.removeprefix("click[").removesuffix("]").isdigit()
                assert policy.tokenizer.decode(turn_b.action_ids, skip_special_tokens=True).startswith(
                    f"<action>{turn_b.action}")
            else:
                assert turn_b.action == turn_a.action
    assert clicks >= 3
