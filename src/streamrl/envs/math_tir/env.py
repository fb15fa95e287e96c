"""``math_tir``: calculation problems solved with a sandboxed Python tool (environments.md 2.5).

The action is the model's whole turn (``action_format="code"``):

* a code block or tool call -> the last one runs in the sandbox; the observation is its output
  (or error line), wrapped and cut to 2,000 characters; the episode goes on;
* otherwise a final ``\\boxed{}`` -> graded; ``terminated``, reward 1 only if correct;
* neither -> a format hint, ``format_valid=False``; the episode goes on.

A code turn beyond ``max_tool_calls`` ends the episode ``truncated`` (reward 0), as does reaching
``max_turns`` without an answer. Code runs stateless by default (a fresh interpreter per call);
``session=True`` keeps one persistent interpreter per episode, closed on ``reset``/``close``.

Task ids: ``train/<seed>`` (unbounded, seeded), ``test/<i>`` (the fixed 1,500; ``ood`` lists its
held-out-template slice). With ``data_path`` the file's rows are ``<data_split>/<i>`` instead.
"""

from __future__ import annotations

import random
from typing import Any

from streamrl.envs.base import Env, EnvSpec, StepResult
from streamrl.envs.math_tir import problems
from streamrl.envs.math_tir.data import load_rows
from streamrl.envs.math_tir.formatting import RESULT_FORMATS, ResultFormat, format_tool_result
from streamrl.envs.math_tir.grading import grade
from streamrl.envs.math_tir.mathverify import MathVerifyChecker, shared_checker
from streamrl.envs.math_tir.prompts import FORMAT_HINT, PromptStyle, tool_instructions
from streamrl.envs.math_tir.tools import BadToolCall, last_tool_call
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
    ):
        """``math_verify``: None uses it when installed, False never, True requires it.
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
        )
        self._checker = self._make_checker(math_verify)
        self._rows = load_rows(data_path, question_field, answer_field, type_field) if data_path is not None else None
        self._data_split = data_split
        splits: dict[str, int | None]
        if self._rows is not None:
            splits = {data_split: len(self._rows)}
        else:
            splits = {"train": None, "test": problems.TEST_SIZE, "ood": len(problems.ood_indices())}
        self.spec = EnvSpec(
            name="math_tir",
            max_steps=_positive_int("max_turns", max_turns),
            action_format="code",
            reward_range=(0.0, 1.0),
            has_admissible_actions=False,
            splits=splits,
            eval_split=data_split if self._rows is not None else "test",
        )
        self._rng = random.Random(seed)
        self._sandbox_session: PythonSession | None = None
        self._task: dict[str, Any] | None = None
        self._done = True

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
        split, _, index_text = task_id.partition("/")
        if not index_text.isdigit():
            raise ValueError(
                f"math_tir: bad task_id {task_id!r} (expected '<split>/<n>', splits: {', '.join(self.spec.splits)})"
            )
        index = int(index_text)
        if self._rows is not None:
            if split != self._data_split or index >= len(self._rows):
                raise ValueError(f"math_tir: task_id {task_id!r} is not in {self._data_split}/0..{len(self._rows) - 1}")
            row = self._rows[index]
            return {
                "question": row.question,
                "answer": row.answer,
                "family": row.task_type,
                "template": None,
                "held_out": False,
            }
        if split == "train":
            problem = problems.train_problem(index, self.knobs)
        elif split == "test" and index < problems.TEST_SIZE:
            problem = problems.eval_set()[index]
        else:
            raise ValueError(
                f"math_tir: bad task_id {task_id!r} (expected 'train/<seed>' or 'test/<0..{problems.TEST_SIZE - 1}>')"
            )
        return {
            "question": problem.question,
            "answer": problem.answer,
            "family": problem.family,
            "template": problem.template,
            "held_out": problem.held_out,
        }

    # ------------------------------------------------------------------ episode
    def reset(
        self,
        seed: int | None = None,
        task_id: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        if options:
            raise ValueError(f"math_tir.reset: unknown options {sorted(options)} (it takes none)")
        self._close_sandbox_session()
        if task_id is None:
            if self._rows is not None:
                index = (seed if seed is not None else self._rng.randrange(2**31)) % len(self._rows)
                task_id = f"{self._data_split}/{index}"
            else:
                if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
                    raise ValueError(f"math_tir.reset: seed must be a non-negative int, got {seed!r}")
                task_id = f"train/{seed if seed is not None else self._rng.randrange(2**31)}"
        self._task = self._load_task(task_id)
        self._task_id = task_id
        self._steps = self._n_tool_calls = self._tool_errors = self._timeouts = 0
        self._pred: str | None = None
        self._correct: bool | None = None
        self._done = False
        observation = f"{self._task['question']}\n\n{self._instructions}"
        return observation, self._info(format_valid=True, effective=True, tool_status=None)

    def step(self, action: str) -> StepResult:
        self.check_step(action, started=self._task is not None, done=self._done)
        self._steps += 1
        call = last_tool_call(action)
        reward, terminated, truncated, reason = 0.0, False, False, None
        format_valid = effective = True
        tool_status = None
        if isinstance(call, BadToolCall):
            observation = f"Your tool call could not be read: {call.reason}. {FORMAT_HINT}"
            format_valid = effective = False
        elif call is not None and self._n_tool_calls >= self.max_tool_calls:
            observation = TOOL_LIMIT_MESSAGE.format(n=self.max_tool_calls)
            truncated, reason, effective = True, "max_tool_calls", False
        elif call is not None:
            result = self._execute(call.code)
            self._n_tool_calls += 1
            self._tool_errors += result.status in _FAILED
            self._timeouts += result.status == "timeout"
            tool_status = result.status
            observation = format_tool_result(result, self.result_format)
        else:
            outcome = grade(action, self._task["answer"], strict=self.strict, checker=self._checker)
            if outcome.pred is None:
                observation, format_valid, effective = FORMAT_HINT, False, False
            else:
                self._pred, self._correct = outcome.pred, outcome.correct
                reward, terminated, reason = float(outcome.correct), True, "answered"
                observation = f"Final answer received: {outcome.pred}"
        if not (terminated or truncated) and self._steps >= self.spec.max_steps:
            truncated, reason = True, "max_turns"
        self._done = terminated or truncated
        if self._done:
            self._close_sandbox_session()
        info = self._info(format_valid=format_valid, effective=effective, tool_status=tool_status)
        if reason is not None:
            info["reason"] = reason
        return StepResult(observation, reward, terminated, truncated, info)

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

    def _info(self, *, format_valid: bool, effective: bool, tool_status: str | None) -> dict[str, Any]:
        assert self._task is not None
        correct = bool(self._correct)
        return {
            "won": correct,
            "score": 1.0 if correct else 0.0,
            "admissible_actions": None,
            "format_valid": format_valid,
            "action_effective": effective,
            "task_id": self._task_id,
            "task_type": self._task["family"],
            "step": self._steps,
            "n_tool_calls": self._n_tool_calls,
            "tool_errors": self._tool_errors,
            "timeouts": self._timeouts,
            "tool_status": tool_status,
            "pred": self._pred,
            "gt": self._task["answer"],
            "correct": self._correct,
            "question": self._task["question"],
            "template": self._task["template"],
            "held_out": self._task["held_out"],
        }

    def _close_sandbox_session(self) -> None:
        if self._sandbox_session is not None:
            self._sandbox_session.close()
            self._sandbox_session = None

    def close(self) -> None:
        self._close_sandbox_session()
        self._done = True
