"""``math_tir``: calculation problems solved with a sandboxed Python tool (environments.md 2.5).

The action is the model's whole turn (``action_format="code"``):

* a code block or tool call -> the last one runs in the sandbox; the observation is its output
  (or error line), wrapped and cut to 2,000 characters; the episode goes on;
* otherwise a final ``\\boxed{}`` -> graded; ``terminated``, reward 1 only if correct;
* neither -> a format hint, ``format_valid=False``; the episode goes on.

A code turn beyond ``max_tool_calls`` ends the episode ``truncated`` (reward 0), as does reaching
``max_turns`` without an answer.

Tool form: a ``python(code)`` tool (its output comes back plain, in the template's tool message) and,
as in Qwen's tool-integrated reasoning, a turn without a call is the final answer. Code runs stateless by default (a fresh interpreter per call);
``session=True`` keeps one persistent interpreter per episode, closed on ``reset``/``close``.

``expert_action()`` demonstrates the protocol (one call printing the known answer, then the
boxed answer) for a warm start that speaks it.

Task ids: ``train/<seed>`` (unbounded, seeded), ``test/<i>`` (the fixed 1,500; ``ood`` lists its
held-out-template slice). With ``data_path`` the file's rows are ``<data_split>/<i>`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamrl.envs.base import Env, EnvSpec, Step
from streamrl.envs.math_tir import problems
from streamrl.envs.math_tir.data import load_rows
from streamrl.envs.math_tir.formatting import (
    RESULT_FORMATS,
    ResultFormat,
    describe_execution,
    format_tool_result,
    truncate_middle,
)
from streamrl.envs.math_tir.grading import grade
from streamrl.envs.math_tir.mathverify import MathVerifyChecker, shared_checker
from streamrl.envs.math_tir.prompts import FORMAT_HINT, TOOL_FORMAT_HINT, PromptStyle, tool_instructions
from streamrl.envs.math_tir.tools import BadToolCall, last_tool_call
from streamrl.envs.tools import tool
from streamrl.sandbox import PythonSession, SandboxResult, resolve_isolation, run_python

TOOL_LIMIT_MESSAGE = "Reached the limit of {n} code executions; no more code can run."
_FAILED = ("error", "memory", "crashed", "output_limit")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"math_tir: {name} must be a positive int, got {value!r}")
    return value


class MathTIREnv(Env):
    def __init__(
        self,
        *,
        max_turns: int = 8,
        max_tool_calls: int = 4,
        tool_timeout_s: float = 5.0,
        memory_mb: int = 1024,
        session: bool = False,
        result_format: ResultFormat = "interpreter",
        prompt_style: PromptStyle = "full",
        strict: bool = True,
        math_verify: bool | None = None,
        isolation: str = "auto",
        digits: int | None = None,
        n_steps: int | None = None,
        distractors: int = 0,
        seed: int | None = None,
        data_path: str | None = None,
        question_field: str = "question",
        answer_field: str = "answer",
        type_field: str | None = None,
        data_split: str = "test",
        tools: bool = False,
    ):
        """``math_verify``: None uses it when installed, False never, True requires it.
        ``tools``: the tool form's instructions and hints (set by ``env.tools: true``).
        ``digits``/``n_steps``/``distractors`` shape training problems (the test set is fixed).
        ``data_path`` (``.jsonl``/``.json``/``.parquet``) replaces the generator with your rows."""
        self.max_tool_calls = _positive_int("max_tool_calls", max_tool_calls)
        if not isinstance(tool_timeout_s, (int, float)) or isinstance(tool_timeout_s, bool) or not tool_timeout_s > 0:
            raise ValueError(f"math_tir: tool_timeout_s must be a positive number, got {tool_timeout_s!r}")
        if result_format not in RESULT_FORMATS:
            raise ValueError(f"math_tir: result_format must be one of {RESULT_FORMATS}, got {result_format!r}")
        self.tool_timeout_s = float(tool_timeout_s)
        self.memory_mb = memory_mb
        self.session = bool(session)
        self.result_format: ResultFormat = result_format
        self.strict = strict
        self.isolation = resolve_isolation(isolation).level
        self.knobs = problems.Knobs(digits=digits, n_steps=n_steps, distractors=distractors)
        self._instructions = tool_instructions(
            session=self.session,
            max_tool_calls=self.max_tool_calls,
            result_format=result_format,
            style=prompt_style,
            tools=tools,
        )
        self._format_hint = TOOL_FORMAT_HINT if tools else FORMAT_HINT
        self._checker = self._make_checker(math_verify)
        self._rows = load_rows(data_path, question_field, answer_field, type_field) if data_path is not None else None
        self._data_split = data_split
        splits: dict[str, int | None]
        if self._rows is not None:
            splits = {data_split: len(self._rows)}
        else:
            splits = {"train": None, "test": problems.TEST_SIZE, "ood": len(problems.ood_indices())}
        super().__init__(seed=seed)
        self.spec = EnvSpec(
            name="math_tir",
            max_steps=_positive_int("max_turns", max_turns),
            action_format="code",
            reward_range=(0.0, 1.0),
            splits=splits,
            eval_split=data_split if self._rows is not None else "test",
        )
        self._sandbox_session: PythonSession | None = None
        self._task: dict[str, Any] | None = None

    @staticmethod
    def _make_checker(math_verify: bool | None) -> MathVerifyChecker | None:
        if math_verify is False:
            return None
        checker = shared_checker()
        if math_verify and checker is None:
            raise ValueError(
                "math_tir: math_verify=True but the math-verify package is not installed (pip install 'streamrl[math]')"
            )
        return checker

    # ------------------------------------------------------------------ tasks
    def task_ids(self, split: str, limit: int | None = None) -> list[str]:
        if split == "ood" and "ood" in self.spec.splits:  # a slice of the test set, not ids of its own
            ids = [f"test/{i}" for i in problems.ood_indices()]
            return ids if limit is None else ids[:limit]
        return super().task_ids(split, limit)

    def _load_task(self, task_id: str) -> dict[str, Any]:
        split, index = self.check_task_id(task_id)
        if self._rows is not None:
            row = self._rows[index]
            return {
                "question": row.question,
                "answer": row.answer,
                "family": row.task_type,
                "template": None,
                "held_out": False,
            }
        problem = problems.train_problem(index, self.knobs) if split == "train" else problems.eval_set()[index]
        return {
            "question": problem.question,
            "answer": problem.answer,
            "family": problem.family,
            "template": problem.template,
            "held_out": problem.held_out,
        }

    def check_task_id(self, task_id: str) -> tuple[str, int]:
        split, index = super().check_task_id(task_id)
        if split == "ood":  # a slice of the test set: its tasks are named test/<i>
            raise ValueError(f"math_tir: bad task_id {task_id!r} (the ood tasks are named test/<i>)")
        return split, index

    # ------------------------------------------------------------------ episode
    def start(self, task_id: str) -> str:
        self._close_sandbox_session()
        self._task = self._load_task(task_id)
        self._n_tool_calls = self._tool_errors = self._timeouts = 0
        self._pred: str | None = None
        self._correct: bool | None = None
        self._tool_status: str | None = None
        return f"{self._task['question']}\n\n{self._instructions}"

    def act(self, action: str) -> Step:
        call = last_tool_call(action)
        if isinstance(call, BadToolCall):
            return Step(f"Your tool call could not be read: {call.reason}. {FORMAT_HINT}", effective=False, valid=False)
        if call is not None:
            return self._run(call.code, lambda result: format_tool_result(result, self.result_format))
        return self._answer(action)

    @tool
    def python(self, code: str) -> Step:
        """Run Python code in a sandbox and return what it prints (a final bare expression is echoed too).

        Args:
            code: the Python source to run
        """
        return self._run(code, lambda result: truncate_middle(describe_execution(result)))

    def reply(self, text: str) -> Step:
        """Tool form: a turn without a call is the final answer."""
        return self._answer(text)

    def expert_action(self) -> str:
        """A protocol demonstrator (``sft.source=expert``): it knows the answer (privileged, as
        alfworld's expert knows where things are), prints it with one tool call, then answers in
        ``\\boxed{}``. It shows the call-then-answer form, not how to solve the problem."""
        assert self._task is not None
        if self._n_tool_calls == 0:
            return f"```python\nprint({self._task['answer']!r})\n```"
        return f"\\boxed{{{self._task['answer']}}}"

    def tool_call_for(self, action: str) -> tuple[str, dict[str, Any]] | None:
        call = last_tool_call(action)
        return ("python", {"code": call.code}) if call is not None and not isinstance(call, BadToolCall) else None

    def describe(self) -> dict[str, Any]:
        assert self._task is not None
        return {
            "task_type": self._task["family"],
            "n_tool_calls": self._n_tool_calls,
            "tool_errors": self._tool_errors,
            "timeouts": self._timeouts,
            "tool_status": self._tool_status,
            "pred": self._pred,
            "gt": self._task["answer"],
            "correct": self._correct,
            "question": self._task["question"],
            "template": self._task["template"],
            "held_out": self._task["held_out"],
        }

    def _run(self, code: str, shown: Callable[[SandboxResult], str]) -> Step:
        """Run ``code`` unless the tool budget is spent; the result as the model reads it."""
        self._tool_status = None
        if self._n_tool_calls >= self.max_tool_calls:
            self._close_sandbox_session()
            return Step(TOOL_LIMIT_MESSAGE.format(n=self.max_tool_calls), truncated=True, effective=False,
                        reason="max_tool_calls")
        result = self._execute(code)
        self._n_tool_calls += 1
        self._tool_errors += result.status in _FAILED
        self._timeouts += result.status == "timeout"
        self._tool_status = result.status
        return Step(shown(result))

    def _answer(self, text: str) -> Step:
        self._tool_status = None
        assert self._task is not None
        outcome = grade(text, self._task["answer"], strict=self.strict, checker=self._checker)
        if outcome.pred is None:
            return Step(self._format_hint, effective=False, valid=False)
        self._pred, self._correct = outcome.pred, outcome.correct
        self._close_sandbox_session()
        return Step(f"Final answer received: {outcome.pred}", reward=float(outcome.correct), done=True,
                    won=outcome.correct, reason="answered")

    def _execute(self, code: str) -> SandboxResult:
        """Run ``code``; a sandbox failure becomes a ``crashed`` result, never an exception."""
        try:
            if not self.session:
                return run_python(
                    code, self.tool_timeout_s, self.memory_mb, isolation=self.isolation, echo_last_expr=True
                )
            if self._sandbox_session is None:
                self._sandbox_session = PythonSession(self.tool_timeout_s, self.memory_mb, isolation=self.isolation)
            return self._sandbox_session.run(code)
        except Exception as exc:  # the tool must never take the caller down
            return SandboxResult("crashed", "", repr(exc), None, 0.0, self.isolation, error=f"sandbox failure: {exc}")

    def _close_sandbox_session(self) -> None:
        if self._sandbox_session is not None:
            self._sandbox_session.close()
            self._sandbox_session = None

    def close(self) -> None:
        self._close_sandbox_session()
        super().close()
