"""Play an environment in the terminal, or list the environments: the command-line layer's
player (``streamrl play``, and ``python -m streamrl.envs``), on the environments' public API.

    streamrl play alfworld_lite [--seed N] [--task-id ID] [--option KEY=VALUE ...] [--tools]
    python -m streamrl.envs list
    python -m streamrl.envs play alfworld_lite ...

``play`` reads one command per line from stdin and prints each observation and the admissible
actions. A command the environment does not understand gets its own answer (``Nothing happens.``
in ALFWorld), never a traceback; ``quit``, ``exit`` or end of input stop cleanly. At a terminal the
line has editing and history (readline). A line opening a fence (```` ``` ````) continues until the
closing fence, so a code block can be typed for environments whose action is code (math_tir).

``play --tools`` plays the tool form: the tools are listed with their parameters, and a line
``name(arg=value, ...)`` (Python call syntax with literal values, positional arguments in the listed
order) is one tool call; any other line is a reply without a call (math_tir's final answer).

``watch`` is the same episode played by a model (``streamrl play ENV --model PATH``): each
observation, the model's reply and the action parsed from it are printed as they happen.
"""

from __future__ import annotations

import argparse
import ast
import sys
from typing import TYPE_CHECKING, Any, Callable, TextIO

from streamrl.envs import AssistantMessage, Env, ToolCall, UnknownEnvironmentError, get_entry, list_envs
from streamrl.envs.registry import BUILD_ERRORS, EnvOptionError, build
from streamrl.rollout.trajectory import DispatchRecord

if TYPE_CHECKING:
    from streamrl.policy.protocols import GenerationRequest, GenerationResult, InferenceEngine

QUIT = {"quit", "exit"}


def option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``; VALUE is a Python literal when it parses as one (``3``, ``True``, ``(1, 2)``)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option needs KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def _print_actions(info: dict[str, Any], out: TextIO) -> None:
    actions = info.get("admissible_actions")
    if actions:
        out.write("Admissible actions: " + ", ".join(actions) + "\n")


def start(name: str, seed: int | None, task_id: str | None, options: dict[str, Any]) -> tuple[Env, str, dict[str, Any]]:
    """Build ``name`` and reset it; ``EnvOptionError`` naming the flag at fault otherwise."""
    env = build("--option", get_entry(name).env, options)
    try:
        observation, info = env.reset(seed=seed, task_id=task_id)
    except BUILD_ERRORS as error:
        env.close()
        raise EnvOptionError(f"{'--task-id' if task_id else '--seed'}: {' '.join(str(error).split())}") from None
    return env, observation, info


#: how a person types an action, by ``EnvSpec.action_format`` (shown once at the start)
TYPING_HINTS = {
    "code": (
        "To run Python, type a line with ```python, then your code line by line, then a line with ``` "
        "(only that block runs; print() what you want to see). To answer, type one line ending with "
        "\\boxed{your answer}, e.g. Answer: \\boxed{42}."
    ),
}
FENCE = "```"


def line_reader(stdin: TextIO, out: TextIO) -> Callable[[str], str | None]:
    """``read(prompt)``: the next line without its newline, or None at end of input.

    At a terminal (``stdin`` is the process's own and a TTY) lines come from ``input()`` with
    readline's editing and history; otherwise from ``stdin.readline()``."""
    interactive = stdin is sys.stdin and stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (importing it gives input() line editing and history)
        except ImportError:  # e.g. Windows without pyreadline
            pass

    def read(prompt: str) -> str | None:
        if interactive:
            try:
                return input(prompt)
            except EOFError:
                return None
        out.write(prompt)
        out.flush()
        line = stdin.readline()
        return line.rstrip("\r\n") if line else None

    return read


def read_action(read: Callable[[str], str | None]) -> str | None:
    """One action: a line, or, when a line opens a fence, every line up to the closing fence."""
    line = read("> ")
    if line is None or not line.strip().startswith(FENCE) or line.strip().count(FENCE) > 1:
        return line
    lines = [line]
    while True:
        more = read("... ")
        if more is None:  # end of input inside the block: take what was typed
            return "\n".join(lines)
        lines.append(more)
        if more.strip() == FENCE:
            return "\n".join(lines)


def tool_signatures(schemas: list[dict[str, Any]]) -> list[str]:
    """``python(code: string) -- Run Python code ...`` for each tool schema."""
    lines = []
    for schema in schemas:
        function = schema["function"]
        parameters = function.get("parameters", {}).get("properties", {})
        arguments = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in parameters.items())
        lines.append(f"{function['name']}({arguments}) -- {function.get('description', '')}")
    return lines


def typed_message(line: str, schemas: list[dict[str, Any]]) -> AssistantMessage:
    """A person's line in the tool form: ``name(arg=value, ...)`` is a call (positional arguments
    take the parameters in order); any other line is a reply without a call."""
    try:
        call = ast.parse(line.strip(), mode="eval").body
    except SyntaxError:
        return AssistantMessage(line)
    names = {schema["function"]["name"]: list(schema["function"].get("parameters", {}).get("properties", {}))
             for schema in schemas}
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in names):
        return AssistantMessage(line)
    def value(node: ast.expr) -> Any:  # a bare word (take(object=cup)) is the string a person meant
        return node.id if isinstance(node, ast.Name) else ast.literal_eval(node)

    try:
        arguments = dict(zip(names[call.func.id], (value(arg) for arg in call.args)))
        arguments.update({kw.arg: value(kw.value) for kw in call.keywords if kw.arg})
    except ValueError:
        return AssistantMessage("", (ToolCall("call_0", raw=line, error="arguments must be literal values: "
                                              "numbers, words or quoted text, lists"),))
    return AssistantMessage("", (ToolCall("call_0", call.func.id, arguments),))


def play(
    name: str, seed: int | None, task_id: str | None, options: dict[str, Any], stdin: TextIO, out: TextIO,
    tools: bool = False,
) -> int:
    env, observation, info = start(name, seed, task_id, options)
    read = line_reader(stdin, out)
    try:
        out.write(f"[{name} task {info.get('task_id')}; type 'quit' to stop]\n")
        schemas = env.tools() if tools else []
        if tools and not schemas:
            out.write(f"[{name} has no tools; playing its text form]\n")
        if schemas:
            out.write("[tools: call one as name(arg=value); any other line is a reply without a call]\n")
            out.write("".join(f"  {signature}\n" for signature in tool_signatures(schemas)))
        hint = None if schemas else TYPING_HINTS.get(env.spec.action_format)
        if hint:
            out.write(f"[how to type: {hint}]\n")
        out.write(f"{observation}\n")
        _print_actions(info, out)
        while True:
            line = read_action(read)
            if line is None or line.strip().lower() in QUIT:
                out.write("\nBye.\n")
                return 0
            try:
                result = env.step(typed_message(line, schemas) if schemas else line.strip())
            except Exception as error:  # a broken environment must not end the session in a traceback
                out.write(f"[environment error: {type(error).__name__}: {error}]\n")
                continue
            if result.messages is not None:
                out.write("".join(f"[{m['role']}{' ' + m['name'] if m.get('name') else ''}] {m['content']}\n"
                                  for m in result.messages))
            else:
                out.write(result.observation + "\n")
            if result.terminated or result.truncated:
                reason = result.info.get("reason", "done")
                out.write(f"[episode over: {reason}; reward {result.reward:g}; {result.info.get('step')} steps]\n")
                return 0
            _print_actions(result.info, out)
    finally:
        env.close()


class _Narrated:
    """An environment for ``EpisodeRunner`` that prints what happens as it happens (calls run in a
    thread, so the runner's timeouts still apply)."""

    def __init__(self, env: Env, name: str, out: TextIO):
        self.env, self.spec, self.name, self.out = env, env.spec, name, out

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    async def reset(self, seed: int | None = None, task_id: str | None = None, options: Any = None) -> Any:
        import asyncio

        observation, info = await asyncio.to_thread(self.env.reset, seed=seed, task_id=task_id, options=options)
        self._write(f"[{self.name} task {info.get('task_id')}; the model plays; Ctrl-C stops]\n{observation}\n")
        _print_actions(info, self.out)
        return observation, info

    def tools(self) -> list[dict[str, Any]]:
        return self.env.tools()

    async def step(self, action: Any) -> Any:
        import asyncio

        shown = action.summary() if isinstance(action, AssistantMessage) else action
        self._write(f"[action: {shown!r}]\n")
        result = await asyncio.to_thread(self.env.step, action)
        self._write(f"{result.observation}\n")
        if not (result.terminated or result.truncated):
            _print_actions(result.info, self.out)
        return result

    async def close(self) -> None:
        self.env.close()


class Narrating:
    """An engine that prints the model's reply to each turn (a watched episode's runner plays on it)."""

    def __init__(self, engine: InferenceEngine, out: TextIO):
        self.engine, self.out = engine, out

    @property
    def version(self) -> int:
        return self.engine.version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await self.engine.generate(request)
        text = result.text if result.text is not None else ""
        quoted = "\n".join(f"  | {line}" for line in text.splitlines() or ["(empty reply)"])
        self.out.write(f"model:\n{quoted}\n")
        self.out.flush()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def watch(name: str, seed: int | None, task_id: str | None, options: dict[str, Any], runner: Any, out: TextIO) -> int:
    """Play one episode of ``name`` with ``runner`` (an ``EpisodeRunner`` over a ``Narrating``
    engine: the evaluation's prompt builder and parser), printing each observation, model reply
    and parsed action."""
    import asyncio
    import time

    env, _, _ = start(name, seed, task_id, options)  # one-line errors for --seed/--task-id/--option
    # reset with what the person asked for, exactly as human play does (task_id None: the env picks)
    record = DispatchRecord(request_id="play", prompt_id=task_id, seq=0,  # type: ignore[arg-type]
                            policy_version=runner.engine.version, env_seed=seed, dispatched_at=time.time())
    try:
        trajectory = asyncio.run(runner.run(_Narrated(env, name, out), record))
    finally:
        env.close()
    verdict = "won" if trajectory.won else "not won"
    error = f" ({trajectory.error})" if trajectory.error else ""
    outcome = "none" if trajectory.outcome is None else f"{trajectory.outcome:g}"
    out.write(f"[episode over: {verdict}; ended {trajectory.end_reason}{error}; outcome {outcome}; "
              f"{len(trajectory.turns)} turns]\n")
    return 0


def list_command(out: TextIO) -> int:
    for name in list_envs():
        try:
            entry = get_entry(name)
            out.write(f"{name}\t{entry.env.__name__}\n")
        except Exception as error:  # e.g. an optional dependency is missing
            out.write(f"{name}\t(unavailable: {type(error).__name__}: {error})\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamrl.envs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the environments")
    play_parser = commands.add_parser("play", help="play an episode from the terminal")
    play_parser.add_argument("name")
    play_parser.add_argument("--seed", type=int, default=None)
    play_parser.add_argument("--task-id", default=None)
    play_parser.add_argument("--option", type=option, action="append", default=[], metavar="KEY=VALUE")
    play_parser.add_argument("--tools", action="store_true", help="play the tool form (call the environment's tools)")
    args = parser.parse_args(argv)
    if args.command == "list":
        return list_command(sys.stdout)
    try:
        return play(args.name, args.seed, args.task_id, dict(args.option), sys.stdin, sys.stdout, args.tools)
    except (UnknownEnvironmentError, EnvOptionError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
