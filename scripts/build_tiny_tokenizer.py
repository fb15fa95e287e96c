"""Build the tiny policy's tokenizer: a ~2k-token byte-level BPE, written to
``src/streamrl/policy/assets/tiny_tokenizer.json`` (+ its ChatML template and a small manifest).

Deterministic: the same corpus gives the same file. The corpus is
  * environment text (weighted up, since the tiny model mostly reads and writes it): expert
    episodes of ``alfworld_lite`` rendered with its prompt builder, ``math_tir`` problems, tool calls
    and tool outputs, ``guess_number`` episodes;
  * general text, so the tokenizer still handles anything: this repository's README and Python
    sources (English docstrings and code) and a fixed list of standard-library modules.
Byte-level BPE covers every byte regardless, so unseen text only costs more tokens.

Usage: python scripts/build_tiny_tokenizer.py [--allow-provisional]
Without ``--allow-provisional`` the build fails when an environment's corpus cannot be produced.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from streamrl.policy.tiny import (  # noqa: E402
    CHAT_TEMPLATE_ASSET,
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    TOKENIZER_ASSET,
    VOCAB_SIZE,
)

ASSETS = REPO / "src" / "streamrl" / "policy" / "assets"
# ChatML without a default system prompt; generation opens an assistant turn
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
STDLIB_MODULES = (
    "argparse", "textwrap", "json.decoder", "fractions", "statistics", "heapq", "bisect",
    "dataclasses", "shlex", "string", "calendar", "difflib", "queue", "random", "pprint",
)
ENV_REPEATS = 3  # environment text counts this many times in the BPE statistics
EPISODES_PER_ENV = 400


def general_corpus() -> Iterator[str]:
    yield (REPO / "README.md").read_text(encoding="utf-8")
    for path in sorted((REPO / "src" / "streamrl").rglob("*.py")):
        yield path.read_text(encoding="utf-8")
    for name in STDLIB_MODULES:
        module = __import__(name, fromlist=["_"])
        yield inspect.getsource(module)


def _chat_text(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def _expert_action(env: object, info: dict) -> str | None:
    """The environment's scripted next action, under the names the embedded envs use."""
    for key in ("expert_action", "expert_plan"):
        value = info.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, str) and value:
            return value
    for method in ("expert_action", "expert_next_action"):
        if callable(getattr(env, method, None)):
            return getattr(env, method)()
    return None


def environment_episodes(name: str, episodes: int) -> Iterator[str]:
    """Rendered episodes of environment ``name``: per-step prompts, observations and the actions an
    expert (when the env exposes one) or the first admissible action takes."""
    from streamrl import envs

    builder = envs.make_prompt_builder(name)
    for seed in range(episodes):
        env = envs.make(name)
        try:
            observation, info = env.reset(seed=seed)
            first, history = observation, []
            system = builder.system_prompt()
            yield _chat_text([{"role": "system", "content": system}] if system else [])
            for _ in range(env.spec.max_steps):
                messages = builder.step_messages(first, history, observation, info)
                action = _expert_action(env, info) or next(iter(info.get("admissible_actions") or []), None)
                if action is None:
                    yield _chat_text(messages)
                    break
                reply = f"<think>I should {action}.</think><action>{action}</action>"
                yield _chat_text([*messages, {"role": "assistant", "content": reply}])
                result = env.step(action)
                history.append((observation, action))
                observation, info = result.observation, result.info
                if result.terminated or result.truncated:
                    yield builder.next_message(observation, info)
                    break
        finally:
            env.close()


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
        name: (lambda name=name: environment_episodes(name, EPISODES_PER_ENV))
        for name in ("alfworld_lite", "math_tir", "guess_number")
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
    (ASSETS / CHAT_TEMPLATE_ASSET).write_text(CHAT_TEMPLATE, encoding="utf-8")
    digest = hashlib.sha256((ASSETS / TOKENIZER_ASSET).read_bytes()).hexdigest()[:16]
    manifest = {"vocab_size": tokenizer.get_vocab_size(), "corpus_chars": parts, "sha256_16": digest}
    (ASSETS / "tiny_tokenizer_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
