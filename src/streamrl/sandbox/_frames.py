"""The frame codec of a persistent session: one JSON message per frame, length-prefixed.

Both sides use it: the session server inside the sandbox (``_run_code.serve_session``, so it
stays standard-library only) and the parent (``session.py``).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

FRAME_HEADER = struct.Struct(">I")  # payload length, big-endian
MAX_FRAME_BYTES = 64 * 1024 * 1024


def encode_frame(message: Any) -> bytes:
    payload = json.dumps(message).encode("utf-8")
    return FRAME_HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes) -> Any:
    return json.loads(payload.decode("utf-8"))


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(fd, remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any | None:
    """Blocking read of one frame; None at end of file or on a malformed header."""
    header = _read_exact(fd, FRAME_HEADER.size)
    if header is None:
        return None
    (size,) = FRAME_HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        return None
    payload = _read_exact(fd, size)
    return None if payload is None else decode_payload(payload)


def write_frame(fd: int, message: Any) -> None:
    data = memoryview(encode_frame(message))
    while data:
        written = os.write(fd, data)
        data = data[written:]
