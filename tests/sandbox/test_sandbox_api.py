"""The one-shot runner's contract: statuses, outputs, isolation reporting, bad input, async use."""

from __future__ import annotations

import ast
import asyncio
import sys
from pathlib import Path

import psutil
import pytest

from streamrl.sandbox import (
    LEVELS,
    SandboxLimits,
    arun_python,
    isolation_level,
    resolve_isolation,
    run_python,
)
from streamrl.sandbox._run_code import compile_cell

from .leaks import BEST_LEVEL, LEVELS_HERE, SAFE_HERE, alive


def test_isolation_level_is_the_safe_default_and_every_result_reports_its_own():
    assert isolation_level() == BEST_LEVEL
    assert SAFE_HERE, f"this machine should reach a safe level (root: 'kernel'), got {BEST_LEVEL}"
    assert LEVELS_HERE[0] == "process" and all(level in LEVELS for level in LEVELS_HERE)
    assert run_python("pass").isolation == BEST_LEVEL
    assert run_python("pass", isolation="process", allow_weak=True).isolation == "process"


def test_stateless_runs_share_nothing():
    first = run_python("secret = 42\nopen('note.txt', 'w').write('x')\nprint(secret)")
    second = run_python("import os\nprint(os.path.exists('note.txt'))\nprint(secret)")
    assert first.stdout == "42\n"
    assert second.stdout == "False\n"
    assert second.status == "error" and second.error == "NameError: name 'secret' is not defined"


def test_error_line_is_the_last_traceback_line_and_stdout_before_it_is_kept():
    result = run_python("print('before')\nimport math\nmath.sqrt(-1)")
    assert result.status == "error" and result.returncode == 1
    assert result.stdout == "before\n"
    assert result.error == "ValueError: math domain error"
    assert result.stderr.startswith("Traceback") and "sandbox" not in result.stderr.lower()


def test_syntax_error_and_exit_codes():
    assert run_python("def (:").error.startswith("SyntaxError")
    assert run_python("import sys\nsys.exit(0)").status == "ok"
    exited = run_python("import sys\nsys.exit(3)")
    assert exited.status == "error" and exited.returncode == 3


def test_echo_last_expression_prints_its_repr_only_when_asked():
    code = "x = [1, 2]\nx + [3]"
    assert run_python(code).stdout == ""
    assert run_python(code, echo_last_expr=True).stdout == "[1, 2, 3]\n"
    assert run_python("print('a')", echo_last_expr=True).stdout == "a\n"  # None is not echoed


def test_compile_cell_splits_only_a_final_bare_expression():
    body, last = compile_cell("a = 1\na + 1", "<t>", echo_last_expr=True)
    assert last is not None
    namespace: dict = {}
    exec(body, namespace)
    assert eval(last, namespace) == 2
    assert compile_cell("a = 1", "<t>", echo_last_expr=True)[1] is None
    assert compile_cell("a = 1\na", "<t>", echo_last_expr=False)[1] is None


def test_the_bootstrap_modules_import_only_the_standard_library_and_the_ones_before_them():
    """The sandboxed interpreter cannot import streamrl, and there a relative import finds only
    the modules the bootstrap registered before it (``CHILD_MODULES`` order)."""
    from streamrl.sandbox.launch import CHILD_MODULES

    registered: set[str] = set()
    for module in CHILD_MODULES:
        for node in ast.walk(ast.parse(Path(module.__file__).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                names = {node.module} if node.module else {alias.name for alias in node.names}
                assert names <= registered, (module.__name__, names - registered)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = {node.module} if isinstance(node, ast.ImportFrom) else {alias.name for alias in node.names}
                assert {name.split(".")[0] for name in names} <= sys.stdlib_module_names, (module.__name__, names)
        registered.add(module.__name__.rpartition(".")[2])


def test_numeric_libraries_and_unicode_work_inside():
    result = run_python("import fractions, decimal, statistics\nprint(fractions.Fraction(1, 3) + 1, 'π≈3.14')")
    assert result.status == "ok" and result.stdout == "4/3 π≈3.14\n"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"timeout": 0}, "timeout_s"),
        ({"timeout": float("nan")}, "timeout_s"),
        ({"memory_mb": 8}, "memory_mb"),
        ({"isolation": "chroot"}, "unknown sandbox isolation"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_python("pass", **kwargs)


def test_non_string_code_is_a_type_error():
    with pytest.raises(TypeError, match="code must be a str"):
        run_python(b"print(1)")  # type: ignore[arg-type]


def test_limits_object_is_used_and_overridden_by_keywords():
    limits = SandboxLimits(timeout_s=3.0, max_output_bytes=1000)
    result = run_python("print('y' * 5000)", limits=limits)
    assert result.status == "output_limit" and len(result.stdout.encode()) <= 1000
    with pytest.raises(ValueError, match="max_output_bytes"):
        SandboxLimits(max_output_bytes=10)


def test_sync_runner_works_inside_a_running_event_loop():
    async def inside():
        return run_python("print(6 * 7)")

    assert asyncio.run(inside()).stdout == "42\n"


def test_cancelling_an_async_run_kills_it_and_cleans_up():
    async def cancel_midway():
        task = asyncio.ensure_future(
            arun_python("import time\nprint('started', flush=True)\ntime.sleep(30)", timeout=30)
        )
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    assert not [child for child in psutil.Process().children(recursive=True) if alive(child)]
    # (the autouse fixture also checks that the work dir is gone)


def test_resolve_isolation_refuses_a_level_this_machine_lacks(monkeypatch):
    from streamrl.sandbox import isolation as iso

    only_process = {"process": resolve_isolation("process", allow_weak=True)}
    monkeypatch.setattr(iso, "available_isolations", lambda: only_process)
    with pytest.raises(ValueError, match="not available on this machine"):
        iso.resolve_isolation("bwrap")
    assert iso.resolve_isolation("auto", allow_weak=True).level == "process"


@pytest.mark.parametrize("level", LEVELS_HERE)
def test_only_the_kernel_levels_pid1_ever_polls_and_kills_for_memory(level):
    """The fallback memory watchdog kills with ``kill(-1)``: only PID 1 of the ``kernel`` level's
    private namespace may run it (anywhere else ``-1`` would reach the whole machine)."""
    import json

    from streamrl.sandbox.isolation import available_isolations
    from streamrl.sandbox.launch import prepare_launch

    launch = prepare_launch(
        mode="once",
        limits=SandboxLimits(),
        isolation=available_isolations()[level],
        use_cgroup=False,
        cpu_seconds=5,
        echo_last_expr=False,
        code="pass",
    )
    try:
        config = json.loads(launch.argv[-1])
    finally:
        launch.cleanup()
    assert (config["memory_poll_bytes"] is not None) == (level == "kernel")
    source = open(__import__("streamrl.sandbox._child", fromlist=["x"]).__file__).read()
    assert "if os.getpid() != 1:\n        memory_limit = None" in source


def test_weak_levels_need_an_explicit_opt_in_by_argument_setting_env_or_config(monkeypatch):
    from streamrl.sandbox import isolation as iso
    from streamrl.training.config import ConfigError
    from streamrl.training.config_files import load_config

    monkeypatch.delenv(iso.ALLOW_WEAK_ENV, raising=False)
    monkeypatch.setattr(iso, "_allow_weak_setting", None)
    with pytest.raises(ValueError, match="weaker than the default safe level"):
        resolve_isolation("process")
    assert resolve_isolation("process", allow_weak=True).level == "process"
    monkeypatch.setenv(iso.ALLOW_WEAK_ENV, "1")
    assert resolve_isolation("process").level == "process"
    monkeypatch.delenv(iso.ALLOW_WEAK_ENV)
    assert load_config(None, ["sandbox.allow_weak=false"]).sandbox.allow_weak is False
    assert not iso.allow_weak()
    with pytest.raises(ConfigError, match="sandbox.allow_weak"):
        load_config(None, ["sandbox.allow_weak=1"])  # a bool, never coerced
    assert load_config(None, ["sandbox.allow_weak=true"]).sandbox.allow_weak is True
    assert iso.allow_weak() and resolve_isolation("process").level == "process"


def test_the_level_in_force_is_announced_once_per_process(monkeypatch, capsys):
    from streamrl.sandbox import isolation as iso

    monkeypatch.setattr(iso, "_announced", set())
    resolve_isolation("auto")
    resolve_isolation("auto")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("streamrl.sandbox:")]
    assert len(lines) == 1 and f"isolation level {BEST_LEVEL}" in lines[0]


def test_the_bwrap_command_binds_the_interpreter_after_every_tmpfs_and_drops_everything():
    from streamrl.sandbox.isolation import BWRAP_WORKDIR, bwrap_command, interpreter_binds

    features = frozenset({"--size", "--disable-userns"})
    argv = bwrap_command("/usr/bin/bwrap", "/tmp/w", ["python", "-c", "x"], 1 << 20, features)
    for flag in ("--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--disable-userns"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL" and argv[argv.index("--uid") + 1] != "0"
    last_tmpfs = max(i for i, arg in enumerate(argv) if arg == "--tmpfs")
    for source, dest in interpreter_binds():
        bind = next(i for i in range(len(argv) - 2) if argv[i : i + 3] == ["--ro-bind", source, dest])
        assert bind > last_tmpfs, f"{dest} is bound before a tmpfs that could hide it"
    for i, arg in enumerate(argv):
        if arg == "--tmpfs":
            assert argv[i - 2] == "--size", "every tmpfs is size-capped"
    assert argv[argv.index("--tmpfs", argv.index("--tmpfs") + 1) + 1] == BWRAP_WORKDIR
    assert argv.index("--remount-ro") > last_tmpfs and argv[-3:] == ["python", "-c", "x"]
    assert "--bind" not in argv  # nothing of the host is writable
