"""What the model sees after its code ran: the output, or the error's last traceback line,
cut to at most 2,000 characters and wrapped ``<interpreter>`` (ReTool) or ```` ```output ```` (ToRA)."""

from __future__ import annotations

from typing import Literal

from streamrl.sandbox import SandboxResult

ResultFormat = Literal["interpreter", "output"]
RESULT_FORMATS = ("interpreter", "output")
MAX_RESULT_CHARS = 2000
NO_OUTPUT = "(no output; print() the values you need)"
STATE_RESET_NOTE = "[state reset]"
TRUNCATION_MARKER = "\n...[{n} chars truncated]...\n"


def truncate_middle(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """``text`` if it fits, else head + ``...[N chars truncated]...`` + tail, at most ``limit``
    characters in all."""
    if len(text) <= limit:
        return text
    # room for the marker, sized for the largest N it can show
    keep = max(0, limit - len(TRUNCATION_MARKER.format(n=len(text))))
    head = keep - keep // 2
    marker = TRUNCATION_MARKER.format(n=len(text) - keep)
    return text[:head] + marker + text[len(text) - keep // 2 :]


def describe_execution(result: SandboxResult) -> str:
    """The plain text of one execution: stdout, then, when it failed, one error line."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if result.status != "ok":
        parts.append(result.error or result.status)
    if result.state_reset:
        parts.append(STATE_RESET_NOTE + " earlier variables are gone; define them again.")
    return "\n".join(parts) if parts else NO_OUTPUT


def wrap_result(body: str, style: ResultFormat = "interpreter") -> str:
    if style == "interpreter":
        return f"<interpreter>\n{body}\n</interpreter>"
    if style == "output":
        return f"```output\n{body}\n```"
    raise ValueError(f"unknown math_tir result_format {style!r}; choose one of {RESULT_FORMATS}")


def format_tool_result(
    result: SandboxResult, style: ResultFormat = "interpreter", limit: int = MAX_RESULT_CHARS
) -> str:
    return wrap_result(truncate_middle(describe_execution(result), limit), style)
