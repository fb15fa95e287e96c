"""SFT warm start: behaviour cloning on demonstrations, in exactly the token layouts RL uses.

Demonstrations are played through the same ``EpisodeRunner`` as RL rollouts, with a
``DemonstrationEngine`` in place of the model: it answers each request with the demonstrator's next
action, written as the model should write it (``<action>...</action>``; in the tool form the call
``env.tool_call_for(action)`` as the chat template writes it) and closed with the end-of-turn id. The resulting trajectories collate into the same samples and masks RL trains on,
and the loss is the negative log-likelihood of the action tokens.

Demonstrators: ``expert`` (the environment's privileged planner, ``env.expert_action()``),
``search_expert`` (the environment's non-privileged ``searching_expert()``), or a JSONL file whose lines are
``{"task_id": ..., "actions": ["<action>go to desk 1</action>", ...]}`` (model texts, replayed).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

import torch

from streamrl.envs import Env, StepResult, make_parser
from streamrl.policy.modeling import enable_gradient_checkpointing
from streamrl.policy.protocols import GenerationRequest, GenerationResult
from streamrl.policy.scoring import default_token_mask, forward_for_loss
from streamrl.rollout import Trajectory
from streamrl.rollout.play_tasks import run_episodes
from streamrl.rollout.roles import prompt_builder
from streamrl.training.batch import collate, micro_batches
from streamrl.training.config import Config
from streamrl.training.environment import Environment, split_task_ids
from streamrl.training.evaluate import episode_runner, episode_settings
from streamrl.training.optim import adamw, clip_and_step
from streamrl.training.progress import TimedLines
from streamrl.training.run import environment_entities

if TYPE_CHECKING:
    from streamrl.policy.policy import Policy

Demonstrator = Callable[[str, dict[str, Any]], str]  # (observation, info) -> model text


def action_text(action: str, require_think: bool) -> str:
    """How a demonstration action is written for the model (the parser's format)."""
    think = f"<think>I will {action}.</think>" if require_think else ""
    return f"{think}<action>{action}</action>"


def tool_call_text(env: Env, action: str, codec: Any) -> str:
    """A demonstration action in the tool form: the environment's call for it, written as the chat
    template writes an assistant tool call (plain text when the environment has no call for it)."""
    call = env.tool_call_for(action)
    if call is None:
        return action
    name, arguments = call
    message = {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "id": "call_0", "function": {"name": name, "arguments": arguments}}]}
    return codec.render_reply(message, tools=env.tools())


class _DemonstratedEnv:
    """An environment (wrapped) that also knows the demonstrator's next action for its current state."""

    def __init__(self, env: Env, demonstrator_factory: Callable[[Env], Demonstrator]):
        self.env = env
        self.spec = env.spec
        self._factory = demonstrator_factory
        self.next_text: str | None = None

    def reset(self, seed=None, task_id=None, options=None):
        observation, info = self.env.reset(seed=seed, task_id=task_id, options=options)
        self._demonstrator = self._factory(self.env)
        self.next_text = self._demonstrator(observation, info)
        return observation, info

    def step(self, action: Any) -> StepResult:
        result = self.env.step(action)
        if not (result.terminated or result.truncated):
            self.next_text = self._demonstrator(result.observation, result.info)
        return result

    def tools(self) -> list[dict[str, Any]]:
        return self.env.tools()

    def close(self) -> None:
        self.env.close()


class DemonstrationEngine:
    """An ``InferenceEngine`` that replies with the demonstrated action of the (one) episode being played."""

    def __init__(self, tokenizer: Any, end_of_turn_id: int):
        self.tokenizer = tokenizer
        self.end_of_turn_id = end_of_turn_id
        self.env: _DemonstratedEnv | None = None

    @property
    def version(self) -> int:
        return 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        text = (self.env.next_text if self.env is not None else None) or ""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))[: request.sampling.max_new_tokens - 1]
        ids.append(self.end_of_turn_id)
        return GenerationResult(request.request_id, ids, [0.0] * len(ids), "stop", 0, text=text)

    def update_weights(self, state_dict: dict, version: int) -> None:
        raise RuntimeError("a DemonstrationEngine has no weights")

    async def close(self) -> None:
        return None


#: (env, action, observation, info) -> the model text that demonstrates ``action``
Writer = Callable[[Env, str, str, dict[str, Any]], str]


def demonstration_writer(config: Config, codec: Any) -> Writer:
    """How demonstrations are written: as the prompt shows the action (e.g. a numbered result), in
    the parser's format (text form) or as the template's tool call (tool form)."""
    prompts = prompt_builder(config.env.name, config.env.prompt, config.env.tools)
    if config.env.tools:
        return lambda env, action, observation, info: tool_call_text(
            env, prompts.shown_action(action, observation, info), codec)
    # demonstrations are written the way the configured parser reads actions
    require_think = bool(getattr(make_parser(config.env.name, **config.env.parser), "require_think", False))
    return lambda env, action, observation, info: action_text(prompts.shown_action(action, observation, info), require_think)


def _demonstrator_factory(source: str, written: Writer, replays: dict[str, list[str]]) -> Callable[[Env], Demonstrator]:
    if source == "expert":
        def privileged(env: Env) -> Demonstrator:
            if not hasattr(env, "expert_action"):
                raise ValueError(f"sft.source expert: environment {env.spec.name} has no expert_action()")
            return lambda observation, info: written(env, env.expert_action() or "look", observation, info)
        return privileged
    if source == "search_expert":
        def searching(env: Env) -> Demonstrator:
            if not hasattr(env, "searching_expert"):
                raise ValueError(f"sft.source search_expert: environment {env.spec.name} has no searching_expert()")
            act = env.searching_expert()
            return lambda observation, info: written(env, act(observation, info), observation, info)
        return searching

    def replay(env: Env) -> Demonstrator:
        actions: list = []

        def act(observation: str, info: dict[str, Any]) -> str:
            if not actions:
                actions.append(iter(replays[info["task_id"]]))
            return next(actions[0], "")
        return act
    return replay


def load_replays(path: Path) -> dict[str, list[str]]:
    if not path.is_file():
        raise FileNotFoundError(f"sft.source: demonstrations file not found: {path}")
    replays = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            replays[str(record["task_id"])] = [str(a) for a in record["actions"]]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: expected {{'task_id': ..., 'actions': [...]}} ({exc})") from None
    return replays


async def demonstrations_and_heldout(config: Config, policy: Policy) -> tuple[list[Trajectory], list[Trajectory]]:
    """What SFT trains on and what it is scored on after each epoch (empty without ``sft.heldout_demos``)."""
    return await collect_demonstrations(config, policy), await collect_demonstrations(config, policy, heldout=True)


async def collect_demonstrations(config: Config, policy: Policy, heldout: bool = False) -> list[Trajectory]:
    """Play ``config.sft.demos`` demonstrations (train split, after the RL prompt pool) to the
    environment's own step cap (the RL turn cap does not apply to demonstrations).

    ``heldout=True`` plays ``config.sft.heldout_demos`` on goals SFT never trains on instead: the
    last ones of the evaluation split (or the replays after the first ``demos``)."""
    sft = config.sft
    replays: dict[str, list[str]] = {}
    if heldout and not sft.heldout_demos:
        return []
    if sft.source in ("expert", "search_expert"):
        with Environment.of(config.env).probe() as probe:
            if heldout:
                goals = split_task_ids(probe, config.env.eval_split or probe.spec.eval_split)
                task_ids = goals[max(0, len(goals) - sft.heldout_demos):]
            else:
                # demonstrations come from train tasks the RL pool does not use
                task_ids = probe.task_ids("train", limit=config.env.train_tasks + sft.demos)[config.env.train_tasks :]
    else:
        replays = load_replays(Path(sft.source))
        task_ids = list(replays)[sft.demos : sft.demos + sft.heldout_demos] if heldout else list(replays)[: sft.demos]
    factory = _demonstrator_factory(sft.source, demonstration_writer(config, policy), replays)
    engine = DemonstrationEngine(policy.tokenizer, policy.end_of_turn_id)

    def demo_env() -> _DemonstratedEnv:
        engine.env = _DemonstratedEnv(Environment.of(config.env).make(), factory)
        return engine.env

    runner = episode_runner(config, engine, policy, replace(episode_settings(config), max_turns=None))
    # one episode at a time: the engine answers for the single environment being played
    # the wrapper has what the episode runner uses of an Env: spec, reset, step, tools, close
    env_factory = cast("Callable[[], Env]", demo_env)
    trajectories = await run_episodes(runner, env_factory, task_ids, concurrency=1, request_prefix="sft")
    if sft.only_successes:
        trajectories = [t for t in trajectories if t.won]
    return [t for t in trajectories if t.turns]


#: a token with log-prob above this has p > 0.5: it is the argmax for sure
LOG_HALF = math.log(0.5)


def _prompt_mask(tensors: dict[str, torch.Tensor], banned_ids: Any) -> torch.Tensor:
    """The prompt tokens that have a real predecessor and are in the action vocabulary: ``[B, T]`` bool."""
    mask = default_token_mask(tensors["attention_mask"]) & ~tensors["action_mask"].bool()
    if len(banned_ids):
        mask &= ~torch.isin(tensors["input_ids"], torch.as_tensor(list(banned_ids), dtype=tensors["input_ids"].dtype))
    return mask


def entity_token_ids(config: Config, tokenizer: Any) -> torch.Tensor:
    """The ids of the environment's entity tokens (``EnvSpec.entity_tokens``), each one token."""
    entities = environment_entities(config)
    if not entities:
        raise ValueError(f"sft.shuffle_entities: environment {config.env.name} declares no entity tokens")
    added = tokenizer.get_added_vocab()
    missing = [token for token in entities if token not in added]
    if missing:
        raise ValueError(f"sft.shuffle_entities: the tokenizer has no single token for {len(missing)} entities "
                         f"(e.g. {missing[0]!r}); start from a tiny model with model.entity_tokens=true")
    return torch.tensor(sorted(added[token] for token in entities))


def shuffle_entities(input_ids: torch.Tensor, entity_ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``input_ids`` ``[B, T]`` with each row's entity tokens renamed at random: every occurrence of
    one entity becomes the same new entity, distinct entities stay distinct, other tokens are kept."""
    renamed = input_ids.clone()
    is_entity = torch.isin(input_ids, entity_ids)
    for row in range(input_ids.shape[0]):
        found = input_ids[row][is_entity[row]]
        if found.numel() == 0:
            continue
        present = found.unique()  # sorted
        names = entity_ids[torch.randperm(entity_ids.numel(), generator=generator)[: present.numel()]]
        renamed[row, is_entity[row]] = names[torch.searchsorted(present, found)]
    return renamed


@torch.no_grad()
def imitation(policy: Policy, demos: list[Trajectory], batch_size: int = 8) -> dict[str, float]:
    """How well the policy reproduces ``demos`` under teacher forcing: action-token NLL, and the
    fraction of actions whose every token gets p > 0.5 (greedy decoding writes them exactly)."""
    nll = tokens = exact = actions = 0.0
    for start in range(0, len(demos), batch_size):
        batch = collate(demos[start : start + batch_size], pad_id=policy.tokenizer.pad_token_id or 0)
        mask = batch.action_mask.bool()
        with policy.autocast():
            out = forward_for_loss(policy.model, batch.input_ids, batch.attention_mask, token_mask=mask,
                                   excluded_ids=policy.banned_token_ids, with_entropy=False)
        logprobs = out.logprobs.float().cpu()
        nll -= float(logprobs[mask].sum())
        tokens += float(mask.sum())
        reproduced = exact_actions(logprobs, mask)
        actions += reproduced.numel()
        exact += float(reproduced.sum())
    return {"nll": nll / max(tokens, 1.0), "action_exact": exact / max(actions, 1.0)}


def exact_actions(logprobs: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """One bool per action (a run of action tokens), rows first, then position: every token of it
    has p > 0.5, so greedy decoding writes it exactly. ``logprobs, action_mask``: ``[B, T]``."""
    mask = action_mask.bool()
    likely = (logprobs > LOG_HALF) | ~mask
    # number each run of action tokens in its row, then ask whether all its tokens are likely
    starts = mask & ~torch.nn.functional.pad(mask[:, :-1], (1, 0))
    span = starts.flatten().cumsum(0).view_as(mask)[mask]
    unlikely = torch.zeros(int(starts.sum()) + 1).index_add_(0, span, (~likely[mask]).float())
    return unlikely[1:] == 0


#: seconds between SFT's progress lines
PROGRESS_EVERY_S = 10.0


def behaviour_cloning(
    config: Config, policy: Policy, demos: list[Trajectory], log: Callable[[int, dict], None] | None = None,
    heldout: list[Trajectory] | None = None, progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Minimise the NLL of demonstrated action tokens (plus ``sft.prompt_loss_weight`` x the prompt
    tokens' NLL); returns the final epoch's metrics, action tokens only (with
    ``heldout_*`` from :func:`imitation` when ``heldout`` demonstrations are given)."""
    sft, optim = config.sft, config.optim
    if not demos:
        raise ValueError("SFT: no usable demonstrations (did every demonstration fail?)")
    model = policy.model
    if config.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    policy.limit_training(top_layers=config.model.train_top_layers, value_rows=False)  # SFT reads no values
    optimizer = adamw(policy.trainable_parameters(), lr=sft.lr, weight_decay=optim.weight_decay)
    rng = random.Random(config.train.seed)
    entity_ids = entity_token_ids(config, policy.tokenizer) if sft.shuffle_entities else None
    generator = torch.Generator().manual_seed(config.train.seed)
    step, metrics = 0, {}
    batches = sft.epochs * -(-len(demos) // sft.batch_size)
    lines = TimedLines(batches, progress, PROGRESS_EVERY_S) if progress is not None else None  # a long SFT is never silent
    model.train()
    for epoch in range(sft.epochs):
        order = list(range(len(demos)))
        rng.shuffle(order)
        total_loss, total_tokens, correct, started = 0.0, 0.0, 0.0, time.perf_counter()
        for start in range(0, len(order), sft.batch_size):
            batch = collate([demos[i] for i in order[start : start + sft.batch_size]], pad_id=policy.tokenizer.pad_token_id or 0)
            tokens = float(batch.action_mask.sum())
            chunks = [batch.rows(rows) for rows in micro_batches(batch, list(range(batch.num_rows)), optim.micro_batch_size)]
            prompts = [_prompt_mask(t, policy.banned_token_ids) if sft.prompt_loss_weight else None for t in chunks]
            prompt_tokens = sum(float(p.sum()) for p in prompts if p is not None)
            for tensors, prompt in zip(chunks, prompts):
                if entity_ids is not None:
                    tensors = {**tensors, "input_ids": shuffle_entities(tensors["input_ids"], entity_ids, generator)}
                mask = tensors["action_mask"].bool()
                with policy.autocast():
                    out = forward_for_loss(
                        model, tensors["input_ids"], tensors["attention_mask"],
                        token_mask=mask if prompt is None else mask | prompt,
                        excluded_ids=policy.banned_token_ids, with_entropy=False,
                    )
                scored = out.logprobs  # [B, T], zero where unscored
                loss = -(scored * mask).sum() / tokens
                if prompt is not None:
                    loss = loss - sft.prompt_loss_weight * (scored * prompt).sum() / max(prompt_tokens, 1.0)
                loss.backward()
                total_loss += float(-(scored.detach() * mask).sum())
                correct += float((scored.detach()[mask] > LOG_HALF).sum())
            clip_and_step(policy.trainable_parameters(), optimizer, optim.grad_clip)
            total_tokens += tokens
            step += 1
            if lines is not None:
                lines.tell(step, f"SFT: epoch {epoch + 1}/{sft.epochs}, batch {step}/{batches}, "
                                 f"NLL {total_loss / max(total_tokens, 1.0):.3f}")
        metrics = {
            "epoch": epoch + 1,
            "nll": total_loss / max(total_tokens, 1.0),
            "token_acc_p50": correct / max(total_tokens, 1.0),
            "tokens_per_s": total_tokens / (time.perf_counter() - started),
            "demos": len(demos),
        }
        if heldout:
            model.eval()
            metrics.update({f"heldout_{key}": value for key, value in imitation(policy, heldout).items()})
            model.train()
        if log is not None:
            log(step, metrics)
    model.eval()
    return metrics
