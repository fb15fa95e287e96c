"""math_tir episodes, the session option, prompts and the local data adapter
(environments.md section 6, math_tir items 3 and 6)."""

from __future__ import annotations

import asyncio
import builtins
import json
import time

import psutil
import pytest

from streamrl.envs import STANDARD_INFO_KEYS, AsyncEnv, get_entry, make, make_parser, make_prompt_builder
from streamrl.envs.math_tir import MathTIREnv
from streamrl.envs.math_tir.env import TOOL_LIMIT_MESSAGE
from streamrl.envs.math_tir.problems import FAMILY_NAMES
from streamrl.envs.math_tir.prompts import FORMAT_HINT


@pytest.fixture(autouse=True)
def no_leftover_processes():
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + 3.0
    while True:
        extra = []
        for child in me.children(recursive=True):
            try:
                if child.pid not in before and child.status() != psutil.STATUS_ZOMBIE:
                    extra.append(child.pid)
            except psutil.NoSuchProcess:
                pass
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra, "math_tir left sandbox processes behind"


def _env(**options) -> MathTIREnv:
    options.setdefault("math_verify", False)
    return make("math_tir", **options)  # type: ignore[return-value]


def _code(source: str) -> str:
    return f"Let me compute.\n```python\n{source}\n```"


def test_reset_gives_the_problem_with_tool_instructions_and_standard_info():
    env = _env()
    observation, info = env.reset(task_id="test/3")
    assert observation.startswith(info["question"]) and "```python" in observation and "\\boxed" in observation
    assert all(key in info for key in STANDARD_INFO_KEYS)
    assert info["step"] == 0 and info["task_id"] == "test/3" and info["task_type"] in FAMILY_NAMES
    assert (info["n_tool_calls"], info["tool_errors"], info["timeouts"], info["pred"], info["correct"]) == (
        0,
        0,
        0,
        None,
        None,
    )
    assert env.spec.action_format == "code" and env.spec.eval_split == "test"
    assert env.spec.splits["test"] == 1500 and env.spec.splits["train"] is None


def test_code_then_correct_answer_terminates_with_reward_one():
    env = _env()
    _, info = env.reset(task_id="test/0")
    ran = env.step(_code("x = 6 * 7\nprint(x)"))
    assert ran.observation == "<interpreter>\n42\n</interpreter>"
    assert not ran.terminated and not ran.truncated and ran.reward == 0.0
    assert ran.info["n_tool_calls"] == 1 and ran.info["tool_status"] == "ok"
    final = env.step(f"So the answer is \\boxed{{{info['gt']}}}.")
    assert final.terminated and not final.truncated and final.reward == 1.0
    assert final.info["won"] and final.info["correct"] and final.info["pred"] == info["gt"]
    assert final.info["reason"] == "answered" and final.info["score"] == 1.0
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("more")


def test_wrong_answer_terminates_with_reward_zero():
    env = _env()
    env.reset(task_id="test/1")
    final = env.step("\\boxed{-123456789}")
    assert final.terminated and final.reward == 0.0 and final.info["correct"] is False and not final.info["won"]


def test_turn_without_code_or_box_gets_a_format_hint():
    env = _env()
    env.reset(task_id="test/2")
    hinted = env.step("I am thinking about it.")
    assert hinted.observation == FORMAT_HINT
    assert not hinted.info["format_valid"] and not hinted.info["action_effective"]
    assert not hinted.terminated and not hinted.truncated
    broken = env.step("<tool_call>{not json</tool_call>")
    assert "could not be read" in broken.observation and not broken.info["format_valid"]
    assert broken.info["n_tool_calls"] == 0


def test_code_wins_over_a_box_in_the_same_turn():
    env = _env()
    env.reset(task_id="test/2")
    result = env.step(_code("print(1)") + "\nso \\boxed{1}")
    assert not result.terminated and result.info["n_tool_calls"] == 1


def test_exceeding_max_tool_calls_truncates_with_reward_zero():
    env = _env(max_tool_calls=2, max_turns=8)
    env.reset(task_id="test/4")
    for _ in range(2):
        assert not env.step(_code("print(0)")).truncated
    over = env.step(_code("print(0)"))
    assert over.truncated and not over.terminated and over.reward == 0.0
    assert over.info["reason"] == "max_tool_calls" and over.observation == TOOL_LIMIT_MESSAGE.format(n=2)
    assert over.info["n_tool_calls"] == 2


def test_max_turns_truncates():
    env = _env(max_turns=3)
    env.reset(task_id="test/5")
    results = [env.step("hmm") for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    assert results[-1].info["reason"] == "max_steps" and results[-1].reward == 0.0


def test_info_counts_tool_errors_and_timeouts():
    env = _env(tool_timeout_s=1.0)
    env.reset(task_id="test/6")
    failed = env.step(_code("print('before')\n1 / 0"))
    assert failed.observation == "<interpreter>\nbefore\nZeroDivisionError: division by zero\n</interpreter>"
    slow = env.step(_code("import time\ntime.sleep(10)"))
    assert "TimeoutError" in slow.observation
    assert (slow.info["n_tool_calls"], slow.info["tool_errors"], slow.info["timeouts"]) == (2, 1, 1)
    assert slow.info["tool_status"] == "timeout"


def test_stateless_by_default_each_call_starts_fresh():
    env = _env()
    env.reset(task_id="test/7")
    env.step(_code("secret = 5"))
    second = env.step(_code("print(secret)"))
    assert "NameError: name 'secret' is not defined" in second.observation


def test_session_option_keeps_state_and_resets_after_a_timeout():
    env = _env(session=True, tool_timeout_s=1.0)
    env.reset(task_id="test/8")
    env.step(_code("secret = 5"))
    assert env.step(_code("secret * 2")).observation == "<interpreter>\n10\n</interpreter>"
    timed_out = env.step(_code("import time\ntime.sleep(10)"))
    assert "[state reset]" in timed_out.observation
    assert "NameError" in env.step(_code("secret")).observation
    env.reset(task_id="test/9")  # closes the episode's worker
    assert "NameError" in env.step(_code("secret")).observation
    env.close()
    env.close()


def test_output_result_format_and_echo_of_the_last_expression():
    env = _env(result_format="output")
    env.reset(task_id="test/10")
    assert env.step(_code("a = 2\na ** 10")).observation == "```output\n1024\n```"


def test_async_envs_step_code_concurrently():
    async def play() -> list[str]:
        envs = [AsyncEnv(_env()) for _ in range(4)]
        await asyncio.gather(*(e.reset(task_id=f"test/{i}") for i, e in enumerate(envs)))
        results = await asyncio.gather(*(e.step(_code(f"print({i} * 11)")) for i, e in enumerate(envs)))
        await asyncio.gather(*(e.close() for e in envs))
        return [r.observation for r in results]

    assert asyncio.run(play()) == [f"<interpreter>\n{i * 11}\n</interpreter>" for i in range(4)]


def test_task_ids_and_bad_ids():
    env = _env()
    assert env.task_ids("test")[:2] == ["test/0", "test/1"] and len(env.task_ids("test")) == 1500
    ood = env.task_ids("ood")
    assert len(ood) == env.spec.splits["ood"] and all(env.reset(task_id=t)[1]["held_out"] for t in ood[:5])
    assert env.task_ids("train", limit=3) == ["train/0", "train/1", "train/2"]
    with pytest.raises(ValueError, match="unbounded"):
        env.task_ids("train")
    for bad in ("test/1500", "dev/1", "test/x", "test"):
        with pytest.raises(ValueError, match="task_id"):
            env.reset(task_id=bad)
    with pytest.raises(RuntimeError, match="reset"):
        _env().step("x")
    with pytest.raises(TypeError, match="must be a str"):
        env.step(123)  # type: ignore[arg-type]


def test_seeded_training_resets_are_deterministic_and_knobs_apply():
    first, second = _env(seed=3), _env(seed=3)
    assert first.reset()[0] == second.reset()[0]
    assert first.reset(seed=11)[1]["task_id"] == "train/11"
    noisy = _env(distractors=2, digits=4)
    assert noisy.reset(seed=11)[1]["question"] != first.reset(seed=11)[1]["question"]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_tool_calls": 0}, "max_tool_calls"),
        ({"max_turns": -1}, "max_turns"),
        ({"tool_timeout_s": 0}, "tool_timeout_s"),
        ({"result_format": "xml"}, "result_format"),
        ({"digits": 40}, "digits"),
        ({"prompt_style": "huge"}, "prompt style"),
        ({"isolation": "vm"}, "isolation"),
    ],
)
def test_bad_options_name_the_problem(options, message):
    with pytest.raises(ValueError, match=message):
        _env(**options)


def test_math_verify_required_but_missing(monkeypatch):
    from streamrl.envs.math_tir import env as env_module

    monkeypatch.setattr(env_module, "shared_checker", lambda: None)
    with pytest.raises(ValueError, match="math-verify"):
        MathTIREnv(math_verify=True)


# ----------------------------------------------------------------------------- data adapter
def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_local_jsonl_gsm8k_style(tmp_path):
    data = _write_jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "What is 1,000 + 319?", "answer": "#### 1,319"},
        ],
    )
    env = _env(data_path=data)
    assert env.spec.splits == {"test": 2} and env.spec.eval_split == "test"
    assert env.task_ids("test") == ["test/0", "test/1"]
    _, info = env.reset(task_id="test/1")
    assert info["gt"] == "1,319" and info["task_type"] == "data"
    assert env.step("\\boxed{1319}").reward == 1.0
    env.reset(task_id="test/0")
    assert env.step("\\boxed{7}").reward == 1.0


def test_local_data_with_custom_fields_and_split(tmp_path):
    data = _write_jsonl(
        tmp_path / "math500.jsonl", [{"problem": "Simplify 2/4.", "solution_value": "\\frac{1}{2}", "type": "Algebra"}]
    )
    env = _env(
        data_path=data, question_field="problem", answer_field="solution_value", type_field="type", data_split="train"
    )
    assert env.spec.splits == {"train": 1} and env.spec.eval_split == "train"
    _, info = env.reset(seed=5)
    assert info["task_id"] == "train/0" and info["task_type"] == "Algebra"
    assert env.step("\\boxed{0.5}").reward == 1.0


def test_data_errors_name_the_file_and_field(tmp_path):
    data = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "x", "answer": "1"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 0 has no field 'question' \(its fields: answer, prompt\)"):
        _env(data_path=data)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "a", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl: line 2 is not valid JSON"):
        _env(data_path=str(broken))
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        _env(data_path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="unsupported data file type '.csv'"):
        _env(data_path=str(tmp_path / "x.csv"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no rows"):
        _env(data_path=str(tmp_path / "empty.jsonl"))


def test_parquet_without_pyarrow_or_pandas_says_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "set.parquet"
    path.write_bytes(b"PAR1")
    real_import = builtins.__import__

    def no_parquet(name, *args, **kwargs):
        if name.split(".")[0] in ("pyarrow", "pandas"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_parquet)
    with pytest.raises(ImportError, match=r"set\.parquet needs pyarrow or pandas"):
        _env(data_path=str(path))


def test_parquet_is_read_when_a_reader_is_installed(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    path = tmp_path / "set.parquet"
    parquet.write_table(pyarrow.table({"question": ["2+2?"], "answer": ["4"]}), path)
    env = _env(data_path=str(path))
    env.reset(task_id="test/0")
    assert env.step("\\boxed{4}").reward == 1.0


# ----------------------------------------------------------------------------- prompts and registry
def test_registry_parser_and_prompt_builder():
    entry = get_entry("math_tir")
    assert entry.env is MathTIREnv
    parser = make_parser("math_tir")
    assert parser.parse(_code("print(1)")).format_valid and not parser.parse("nothing").format_valid
    builder = make_prompt_builder("math_tir", session=True, max_tool_calls=3)
    system = builder.system_prompt()
    assert "```python" in system and "\\boxed" in system and "at most 3 times" in system and "persist" in system
    compact = make_prompt_builder("math_tir", style="compact").system_prompt()
    assert len(compact) < len(system) / 3 and "\\boxed" in compact


def test_first_and_next_messages_and_the_per_step_layout():
    env, builder = _env(), make_prompt_builder("math_tir", history_length=1)
    observation, info = env.reset(task_id="test/0")
    assert builder.first_message(observation, info) == info["question"]
    action_1, action_2 = _code("print(1)"), _code("print(2)")
    step_1 = env.step(action_1)
    step_2 = env.step(action_2)
    assert builder.next_message(step_1.observation, step_1.info) == step_1.observation
    history = [(observation, action_1), (step_1.observation, action_2)]
    full = make_prompt_builder("math_tir").step_messages(observation, history, step_2.observation, step_2.info)
    assert [m["role"] for m in full] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert full[1]["content"] == info["question"] and full[2]["content"] == action_1
    assert full[3]["content"] == step_1.observation and full[5]["content"] == step_2.observation
    last_only = builder.step_messages(observation, history, step_2.observation, step_2.info)
    assert [m["role"] for m in last_only] == ["system", "user", "assistant", "user"]
    assert "1 earlier step omitted" in last_only[1]["content"] and last_only[1]["content"].endswith(step_1.observation)
    assert last_only[2]["content"] == action_2 and last_only[3]["content"] == step_2.observation
    opening = builder.step_messages(observation, [], observation, info)
    assert [m["role"] for m in opening] == ["system", "user"]
    empty_turn = make_prompt_builder("math_tir").step_messages(
        observation, [(observation, "")], step_1.observation, info
    )
    assert all(m["content"] for m in empty_turn)
