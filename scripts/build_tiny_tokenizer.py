"""Build the tiny policy's tokenizer: a ~2k-token byte-level BPE, written to
``src/streamrl/policy/assets/tiny_tokenizer.json`` (+ a small manifest). The chat template next to
it, ``tiny_chat_template.jinja`` (ChatML with Hermes-style tools), is maintained by hand, and the
tool markup tokens are added on load (``streamrl.policy.tiny.TOOL_MARKUP_TOKENS``).

Deterministic: the same corpus gives the same file. The corpus is
  * environment text (weighted up, since the tiny model mostly reads and writes it), rendered with
    each environment's prompt builder, per-step and full-history: ``alfworld_lite`` expert episodes
    (both prompt styles, replies written like the SFT demonstrations), ``math_tir`` problems with a
    scripted Python tool call (run in the sandbox) and a boxed answer, ``guess_number`` binary
    searches;
  * general text, so the tokenizer still handles anything: the sources of a fixed list of
    standard-library modules (English docstrings and Python code).
Byte-level BPE covers every byte regardless, so unseen text only costs more tokens.

Usage: python scripts/build_tiny_tokenizer.py [--allow-provisional]
Without ``--allow-provisional`` the build fails when an environment's corpus cannot be produced.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from streamrl.policy.tiny import (  # noqa: E402
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    TOKENIZER_ASSET,
    VOCAB_SIZE,
)

ASSETS = REPO / "src" / "streamrl" / "policy" / "assets"
STDLIB_MODULES = (
    "argparse",
    "textwrap",
    "json.decoder",
    "fractions",
    "statistics",
    "heapq",
    "bisect",
    "dataclasses",
    "shlex",
    "string",
    "calendar",
    "difflib",
    "queue",
    "random",
    "pprint",
    "logging",
    "collections",
    "unittest.case",
    "http.client",
    "email.message",
    "datetime",
)
ENV_REPEATS = 3  # environment text counts this many times in the BPE statistics
EPISODES_PER_ENV = 400


def general_corpus() -> Iterator[str]:
    """Standard-library sources: English docstrings and Python code that do not change with this
    repository (only with the Python version)."""
    for name in STDLIB_MODULES:
        module = __import__(name, fromlist=["_"])
        yield inspect.getsource(module)


def _chat_text(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def _reply(action: str) -> str:
    """An ALFWorld turn as the SFT demonstrations write it."""
    return f"<think>I will {action}.</think><action>{action}</action>"


def _play(env, builder, reset_seed: int, act) -> Iterator[str]:
    """One episode rendered twice: per-step prompts (one chat per step) and one full-history chat.

    ``act(observation, info, turn)`` returns ``(reply_text, env_action)`` or None to stop."""
    observation, info = env.reset(seed=reset_seed)
    first, history = observation, []
    system = builder.system_prompt()
    transcript = [{"role": "system", "content": system}] if system else []
    transcript.append({"role": "user", "content": builder.first_message(observation, info)})
    for turn in range(env.spec.max_steps):
        move = act(observation, info, turn)
        if move is None:
            break
        reply, action = move
        yield _chat_text(
            [*builder.step_messages(first, history, observation, info), {"role": "assistant", "content": reply}]
        )
        transcript.append({"role": "assistant", "content": reply})
        result = env.step(action)
        history.append((observation, action))
        observation, info = result.observation, result.info
        transcript.append({"role": "user", "content": builder.next_message(observation, info)})
        if result.terminated or result.truncated:
            break
    yield _chat_text(transcript)


def alfworld_corpus(episodes: int) -> Iterator[str]:
    """Expert episodes of ``alfworld_lite``, in both prompt styles."""
    from streamrl import envs

    def expert(env):
        def act(observation, info, turn):
            action = env.expert_action()
            return None if action is None else (_reply(action), action)

        return act

    for seed in range(episodes):
        env = envs.make("alfworld_lite")
        builder = envs.make_prompt_builder("alfworld_lite", style=("verl", "compact")[seed % 2])
        try:
            yield from _play(env, builder, seed, expert(env))
        finally:
            env.close()


def math_corpus(episodes: int) -> Iterator[str]:
    """``math_tir`` problems with a scripted tool call (run in the sandbox) and a boxed answer."""
    from streamrl import envs

    def scripted(observation, info, turn):
        if turn == 0:
            numbers = ", ".join(re.findall(r"\d+(?:\.\d+)?", info["question"]))
            reply = f"Let me compute with Python.\n```python\nvalues = [{numbers}]\nprint(sum(values))\n```"
            return reply, reply
        if turn == 1:
            reply = f"The calculation is done.\nAnswer: \\boxed{{{info['gt']}}}"
            return reply, reply
        return None

    for seed in range(episodes):
        env = envs.make("math_tir")
        try:
            yield from _play(env, envs.make_prompt_builder("math_tir"), seed, scripted)
        finally:
            env.close()


class BinarySearch:
    """A ``guess_number`` player that halves the known range after each answer."""

    def __init__(self) -> None:
        self.low, self.high = 1, 100

    def __call__(self, observation: str, info: dict, turn: int) -> tuple[str, str]:
        if "too low" in observation:
            self.low = guess_of(observation) + 1
        elif "too high" in observation:
            self.high = guess_of(observation) - 1
        guess = str((self.low + self.high) // 2)
        return f"<action>{guess}</action>", guess


def guess_number_corpus(episodes: int) -> Iterator[str]:
    """Binary-search games of ``guess_number``."""
    from streamrl import envs

    for seed in range(episodes):
        env = envs.make("guess_number")
        try:
            yield from _play(env, envs.make_prompt_builder("guess_number"), seed, BinarySearch())
        finally:
            env.close()


def guess_of(observation: str) -> int:
    return int(re.match(r"\s*(\d+)", observation).group(1))


def build(corpus: list[str]) -> object:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKUP_TOKENS),
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allow-provisional", action="store_true", help="build even if an env corpus fails")
    args = parser.parse_args()

    corpus = list(general_corpus())
    parts: dict[str, int] = {"general": sum(map(len, corpus))}
    sources: dict[str, Callable[[], Iterator[str]]] = {
        "alfworld_lite": lambda: alfworld_corpus(EPISODES_PER_ENV),
        "math_tir": lambda: math_corpus(EPISODES_PER_ENV // 2),
        "guess_number": lambda: guess_number_corpus(EPISODES_PER_ENV // 4),
    }
    for name, produce in sources.items():
        try:
            texts = list(produce())
        except Exception as exc:  # an env that does not exist yet, or misbehaves
            if not args.allow_provisional:
                raise SystemExit(f"corpus for {name} failed ({exc!r}); rerun with --allow-provisional") from exc
            print(f"WARNING: no {name} corpus ({exc!r}); the tokenizer is provisional", file=sys.stderr)
            parts[name] = 0
            continue
        corpus.extend(texts * ENV_REPEATS)
        parts[name] = sum(map(len, texts))

    tokenizer = build(corpus)
    ASSETS.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(ASSETS / TOKENIZER_ASSET))
    digest = hashlib.sha256((ASSETS / TOKENIZER_ASSET).read_bytes()).hexdigest()[:16]
    manifest = {"vocab_size": tokenizer.get_vocab_size(), "corpus_chars": parts, "sha256_16": digest}
    (ASSETS / "tiny_tokenizer_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
