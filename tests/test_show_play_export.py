"""Issue 13, items 5 and 6: ``streamrl show`` (transcripts), ``streamrl play --model`` (watching a
policy), line editing and code blocks in human ``play``, and ``streamrl export`` (a Hugging Face
folder that loads without streamrl)."""

from __future__ import annotations

import io
import json

import pytest
import torch

from streamrl import cli
from streamrl.play import TYPING_HINTS, play, read_action

SMALL_TINY = "tiny:hidden=64,layers=2,heads=4,kv_heads=2,intermediate=128"
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


def _record(kind: str, step: int, won: bool, task_id: str, advantage: float | None = None) -> dict:
    return {
        "kind": kind, "step": step, "tag": f"{kind}-v{step}", "request_id": f"r{step}", "task_id": task_id,
        "task_type": "pick", "task": f"Your task is to: put {task_id} in fridge.", "won": won,
        "outcome": 1.0 if won else 0.0, "end_reason": "terminated" if won else "max_turns", "policy_version": step,
        "turns": [
            {"action_text": "go to fridge 1\nand more", "action": "go to fridge 1", "observation": "The fridge 1 is closed.",
             "reward": 0.0, "format_valid": True, "advantage": advantage},
            {"action_text": "<garbage", "action": "", "observation": "Nothing happens.", "reward": 1.0 if won else 0.0,
             "format_valid": False, "advantage": advantage},
        ],
    }


@pytest.fixture
def run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    records = [_record("train", 1, True, "train/1", 0.5), _record("train", 2, False, "train/2", -0.25),
               _record("eval", 2, True, "test/0"), _record("eval", 2, False, "test/1")]
    lines = [json.dumps(r) for r in records]
    (run / "samples.jsonl").write_text("\n".join(lines) + "\n" + '{"kind": "eval", "turns": [')  # a run still writing
    return run


# -- show ----------------------------------------------------------------------------------------


def test_show_prints_the_newest_transcripts_readably(run_folder, capsys):
    assert cli.main(["show", str(run_folder), "--last", "3"]) == 0
    out = capsys.readouterr().out
    assert "train/1" not in out and out.count("=" * 80) == 3  # the newest three, oldest first
    assert out.index("train/2") < out.index("test/0") < out.index("test/1")
    assert "eval step 2 (eval-v2) task test/0 [pick]: WON, outcome 1, 2 turns, ended terminated" in out
    assert "> go to fridge 1\n> and more\nThe fridge 1 is closed." in out  # every action line quoted
    assert "advantage -0.250" in out and "invalid format" in out and "parsed action: ''" in out
    assert "\x1b[" not in out  # plain text when stdout is not a terminal


def test_show_filters_by_kind_and_failures(run_folder, capsys):
    assert cli.main(["show", str(run_folder), "--kind", "train", "--failures"]) == 0
    out = capsys.readouterr().out
    assert "train/2" in out and "train/1" not in out and "test/" not in out
    assert cli.main(["show", str(run_folder), "--kind", "eval", "--failures", "--last", "1"]) == 0
    out = capsys.readouterr().out
    assert "test/1" in out and "test/0" not in out


def test_show_renders_with_rich_at_a_terminal(run_folder):
    from rich.console import Console

    from streamrl.training.samples import read_samples, rich_transcript

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    for record in read_samples(run_folder / "samples.jsonl"):
        console.print(rich_transcript(record))
    text = console.file.getvalue()
    assert "\x1b[" in text and "go to fridge 1" in text and "WON" in text


@pytest.mark.parametrize("make, expected", [
    (lambda tmp: tmp / "none", "RUN: no run folder at"),
    (lambda tmp: tmp, "samples.jsonl does not exist"),
])
def test_show_without_a_run_or_transcripts_is_one_line(tmp_path, capsys, make, expected):
    assert cli.main(["show", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("streamrl show: error: ") and expected in err


def test_show_with_nothing_matching_says_so(tmp_path, capsys):
    (tmp_path / "samples.jsonl").write_text(json.dumps(_record("train", 1, True, "train/1")) + "\n")
    assert cli.main(["show", str(tmp_path), "--failures"]) == 0
    assert "no lost transcripts in" in capsys.readouterr().out


# -- play ----------------------------------------------------------------------------------------


def test_a_fenced_block_is_read_up_to_its_closing_fence():
    lines = iter(["```python", "x = 6 * 7", "print(x)", "```", "look"])
    read = lambda prompt: next(lines, None)  # noqa: E731
    assert read_action(read) == "```python\nx = 6 * 7\nprint(x)\n```"
    assert read_action(read) == "look"
    assert read_action(read) is None
    assert read_action(lambda prompt: "```python print(1)```") == "```python print(1)```"  # one-line block


def test_a_person_plays_math_tir_with_a_typed_code_block():
    stdin = io.StringIO("```python\nprint(6 * 7)\n```\nAnswer: \\boxed{3}\n")
    out = io.StringIO()
    assert play("math_tir", None, "train/0", {}, stdin, out) == 0
    text = out.getvalue()
    assert f"[how to type: {TYPING_HINTS['code']}]" in text
    assert "```python" in TYPING_HINTS["code"] and "\\boxed{" in TYPING_HINTS["code"]
    assert "42" in text  # the block ran
    assert "Final answer received: 3" in text and "[episode over: answered;" in text


def test_a_person_plays_math_tir_with_tool_calls():
    stdin = io.StringIO("python(code='print(6 * 7)')\npython(cod=1)\nthe answer is \\boxed{3}\n")
    out = io.StringIO()
    assert play("math_tir", None, "train/0", {}, stdin, out, tools=True) == 0
    text = out.getvalue()
    assert "python(code: string)" in text and "[how to type" not in text
    assert "[tool python] 42" in text  # the call ran in the sandbox, its result a tool message
    assert "unexpected argument 'cod'" in text  # a bad call is answered, not raised
    assert "[episode over: answered;" in text


def test_human_play_uses_readline_at_a_terminal(monkeypatch):
    import sys

    import streamrl.play as envs_main

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal("")
    monkeypatch.setattr(sys, "stdin", terminal)
    monkeypatch.delitem(sys.modules, "readline", raising=False)
    prompts = []
    monkeypatch.setattr("builtins.input", lambda prompt="": prompts.append(prompt) or "quit")
    out = io.StringIO()
    assert envs_main.play("guess_number", None, "test/0", {}, terminal, out) == 0
    assert "readline" in sys.modules and prompts == ["> "] and "Bye." in out.getvalue()


def test_play_model_watches_a_policy_play(tmp_path, capsys):
    from streamrl.policy import load_policy

    model = load_policy(SMALL_TINY).save(tmp_path / "model")
    argv = ["play", "guess_number", "--task-id", "test/0", "--model", str(model), "rollout.max_turns=2",
            "rollout.max_new_tokens=6"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "[guess_number task test/0; the model plays" in out
    assert out.count("model:\n  | ") == 2 and out.count("[action: ") == 2
    assert "[episode over: not won; ended max_turns" in out and "2 turns]" in out


def test_play_model_errors_are_one_line(tmp_path, capsys):
    for argv, expected in (
        (["play", "guess_number", "--model", str(tmp_path / "none")], "no model folder"),
        (["play", "guess_number", "--model", str(tmp_path)], "--model: "),
        (["play", "guess_number", "--config", "smoke"], "--config: only used with --model"),
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err


# -- export --------------------------------------------------------------------------------------


def _nontrivial(policy):
    with torch.no_grad():  # a non-trivial adapter, value rows included
        for name, param in policy.model.named_parameters():
            if "lora_B" in name or "trainable_tokens" in name:
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    return policy


def _prompt(policy) -> tuple[str, torch.Tensor]:
    messages = [{"role": "user", "content": "take apple 1 from countertop 2"}]
    text = policy.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return text, torch.tensor([policy.encode_chat(messages)])


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _loads_alone_with_the_same_logits(folder, policy):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text, ids = _prompt(policy)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids[0].tolist()
    assert model.get_input_embeddings().weight.shape[0] == policy.vocab_size  # value-token rows kept
    assert torch.allclose(_logits(model, ids), _logits(policy.model, ids), atol=1e-5)


@pytest.mark.parametrize("lora", [None, {"r": 4}], ids=["full", "lora-merged"])
def test_export_writes_a_folder_transformers_loads_alone(tmp_path, capsys, lora):
    from streamrl.policy import load_policy

    policy = _nontrivial(load_policy(SMALL_TINY, lora=lora))
    source = policy.save(tmp_path / "policy")
    assert cli.main(["export", str(source), "--out", str(tmp_path / "hf")]) == 0
    assert "exported to" in capsys.readouterr().out
    assert (tmp_path / "hf" / "model.safetensors").is_file() and not (tmp_path / "hf" / "adapter_config.json").exists()
    _loads_alone_with_the_same_logits(tmp_path / "hf", policy)
    again = load_policy(str(tmp_path / "hf"))  # and streamrl reads it back with the same value tokens
    assert again.value_token_ids == policy.value_token_ids and not again.is_lora


def test_export_adapter_of_a_tiny_lora_writes_its_base(tmp_path, capsys):
    from peft import AutoPeftModelForCausalLM

    from streamrl.policy import load_policy

    policy = _nontrivial(load_policy(SMALL_TINY, lora={"r": 4}))
    source = policy.save(tmp_path / "policy")
    assert cli.main(["export", str(source), "--out", str(tmp_path / "adapter"), "--adapter"]) == 0
    capsys.readouterr()
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp_path / "adapter" / "base_model").resolve())
    model = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter")
    _, ids = _prompt(policy)
    assert torch.allclose(_logits(model, ids), _logits(policy.model, ids), atol=1e-5)


@pytest.fixture
def hf_folder(tmp_path):
    """A random Llama saved with save_pretrained, with the tiny tokenizer (as tests/policy's)."""
    import transformers

    from streamrl.policy.tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    folder = tmp_path / "llama"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_lora_adapter_on_a_model_folder_names_its_base(tmp_path, hf_folder):
    from peft import AutoPeftModelForCausalLM

    from streamrl.policy import load_policy

    policy = _nontrivial(load_policy(str(hf_folder), lora={"r": 4}))
    folder = policy.save(tmp_path / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(hf_folder.resolve())
    model = AutoPeftModelForCausalLM.from_pretrained(folder)  # PEFT alone, onto the original base folder
    _, ids = _prompt(policy)
    assert torch.allclose(_logits(model, ids), _logits(policy.model, ids), atol=1e-5)


def test_export_of_a_run_folder_uses_final_model_else_the_newest_valid_checkpoint(tmp_path, capsys):
    from streamrl.policy import load_policy
    from streamrl.training.checkpoint import save_checkpoint

    run = tmp_path / "run"
    older, newer = load_policy(SMALL_TINY, seed=1), load_policy(SMALL_TINY, seed=2)
    save_checkpoint(run / "checkpoints", 2, {}, lambda folder: older.save(folder / "policy"))
    save_checkpoint(run / "checkpoints", 4, {}, lambda folder: newer.save(folder / "policy"))
    (run / "checkpoints" / "step_00000004" / "policy" / "model.safetensors").write_bytes(b"torn")  # fails to verify
    assert cli.main(["export", str(run), "--out", str(tmp_path / "a")]) == 0
    assert "step_00000002" in capsys.readouterr().out
    _loads_alone_with_the_same_logits(tmp_path / "a", older)

    newer.save(run / "final_model")
    assert cli.main(["export", str(run), "--out", str(tmp_path / "b")]) == 0
    assert "final_model" in capsys.readouterr().out
    _loads_alone_with_the_same_logits(tmp_path / "b", newer)


def test_export_errors_are_one_line(tmp_path, capsys):
    from streamrl.policy import load_policy

    plain = load_policy(SMALL_TINY).save(tmp_path / "plain")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "empty_run").mkdir()
    for argv, expected in (
        (["export", str(plain), "--out", str(tmp_path / "o1"), "--adapter"], "--adapter: this policy has no LoRA"),
        (["export", str(plain), "--out", str(tmp_path / "full")], "--out: "),
        (["export", str(plain), "--out", str(plain)], "--out: "),
        (["export", str(tmp_path / "empty_run"), "--out", str(tmp_path / "o2")], "RUN_OR_MODEL: "),
        (["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "o3")], "no model folder"),
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err and "Traceback" not in err, err
