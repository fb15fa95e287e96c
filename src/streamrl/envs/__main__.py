"""Play an environment in the terminal, or list the environments.

    python -m streamrl.envs list
    python -m streamrl.envs play alfworld_lite [--seed N] [--task-id ID] [--option KEY=VALUE ...]

``play`` reads one command per line from stdin and prints each observation and the admissible
actions. A command the environment does not understand gets its own answer (``Nothing happens.``
in ALFWorld), never a traceback; ``quit``, ``exit`` or end of input stop cleanly.
"""

from __future__ import annotations

import argparse
import ast
import sys
from typing import Any, TextIO

from streamrl.envs.base import Env
from streamrl.envs.registry import BUILD_ERRORS, EnvOptionError, UnknownEnvironmentError, build, get_entry, list_envs

QUIT = {"quit", "exit"}


def _option(text: str) -> tuple[str, Any]:
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


def play(name: str, seed: int | None, task_id: str | None, options: dict[str, Any], stdin: TextIO, out: TextIO) -> int:
    env, observation, info = start(name, seed, task_id, options)
    try:
        out.write(f"[{name} task {info.get('task_id')}; type 'quit' to stop]\n{observation}\n")
        _print_actions(info, out)
        while True:
            out.write("> ")
            out.flush()
            line = stdin.readline()
            if not line or line.strip().lower() in QUIT:
                out.write("\nBye.\n")
                return 0
            try:
                result = env.step(line.strip())
            except Exception as error:  # a broken environment must not end the session in a traceback
                out.write(f"[environment error: {type(error).__name__}: {error}]\n")
                continue
            out.write(result.observation + "\n")
            if result.terminated or result.truncated:
                reason = result.info.get("reason", "done")
                out.write(f"[episode over: {reason}; reward {result.reward:g}; {result.info.get('step')} steps]\n")
                return 0
            _print_actions(result.info, out)
    finally:
        env.close()


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
    play_parser.add_argument("--option", type=_option, action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if args.command == "list":
        return list_command(sys.stdout)
    try:
        return play(args.name, args.seed, args.task_id, dict(args.option), sys.stdin, sys.stdout)
    except (UnknownEnvironmentError, EnvOptionError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
