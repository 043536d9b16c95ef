"""Wire format between the host and a jailed worker, and between a worker and its job children.

Frames are a 4-byte big-endian length followed by UTF-8 JSON.  JSON only: never pickle, because
whatever crosses this boundary was produced next to untrusted code.  Every reader bounds the length
before allocating, so a hostile or broken peer cannot make the reader buffer gigabytes.

This module is imported inside the jail, so it uses the standard library only.
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

HEADER = struct.Struct(">I")
# Largest frame either side accepts.  Results are small (details are cut); jobs carry payloads.
MAX_FRAME_BYTES = 64 * 1024 * 1024


class ProtocolError(Exception):
    """The peer sent something that is not a well-formed frame (or closed the pipe)."""


class FrameTimeout(ProtocolError):
    """No complete frame arrived before the deadline."""


def _make_fast_encoder() -> Callable[[Any, int], Sequence[str]] | None:
    # json.dumps(..., separators=..., allow_nan=False) builds a JSONEncoder per call; the C encoder,
    # made once, skips that (and the Python-level circular-reference bookkeeping: a circular
    # structure ends in RecursionError instead).  Output is the same as json.dumps'.
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    encoder: Callable[[Any, int], Sequence[str]] = make(
        None, _not_serializable, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False
    )
    return encoder


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_fast_encoder = _make_fast_encoder()


def encode_json(message: Any) -> bytes:
    """Compact ASCII JSON; raises ValueError for NaN/infinities or circular data, TypeError for non-JSON types."""
    if _fast_encoder is None:
        return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    try:
        return "".join(_fast_encoder(message, 0)).encode()
    except RecursionError as exc:
        raise ValueError(f"too deeply nested or circular: {exc}") from exc


def frame_from_body(body: bytes) -> bytes:
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


def encode_frame(message: Any) -> bytes:
    return frame_from_body(encode_json(message))


# A batch frame is {"stream":<bool>,"jobs":[<job>,...]}; the host encodes each job once (when it is
# submitted) and splices the encoded jobs into the frame, so a retried job is never encoded again.
_BATCH_OPEN = (b'{"stream":false,"jobs":[', b'{"stream":true,"jobs":[')
BATCH_FRAME_OVERHEAD = HEADER.size + len(_BATCH_OPEN[1]) + 2


def encode_batch_frame(encoded_jobs: list[bytes], stream: bool) -> bytes:
    """The frame of ``{"stream": stream, "jobs": [...]}`` from jobs already encoded with encode_json."""
    return frame_from_body(_BATCH_OPEN[stream] + b",".join(encoded_jobs) + b"]}")


def batch_frame_size(encoded_sizes: int, count: int) -> int:
    """Bytes of the batch frame of ``count`` jobs whose encodings add up to ``encoded_sizes`` bytes."""
    return BATCH_FRAME_OVERHEAD + encoded_sizes + max(0, count - 1)


def reply_bytes_bound(max_details_chars: int) -> int:
    """Most bytes one reply of a worker can take in a frame (details <= max_details_chars plus a cut
    note, or a traceback cut to 4000 chars; <= 6 bytes per char as JSON escapes) plus its fields."""
    return 6 * (max(max_details_chars, 4000) + 64) + 1024


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_frame(fd: int, message: Any) -> None:
    write_all(fd, encode_frame(message))


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FrameTimeout("timed out waiting for a frame")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise FrameTimeout("timed out waiting for a frame")
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise ProtocolError("peer closed the channel")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None, max_bytes: int = MAX_FRAME_BYTES) -> Any:
    """Read one frame; ``deadline`` is a ``time.monotonic()`` value or None to block."""
    (length,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    if length > max_bytes:
        raise ProtocolError(f"frame announces {length} bytes, more than the {max_bytes} allowed")
    body = _read_exact(fd, length, deadline)
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc


class InvalidGraderResult(ValueError):
    """A grading target returned something other than the documented result dict."""


def validate_grader_result(result: Any, max_details_chars: int) -> dict[str, Any]:
    """Check the target's return value and normalise it (details cut to ``max_details_chars``).

    Contract: ``{"score": float in [0, 1], "passed": bool, "details": str}`` plus an optional
    ``"reason": str`` that says why a completion scored what it did (default "passed"/"wrong").
    """
    if not isinstance(result, dict):
        raise InvalidGraderResult(f"grader returned {type(result).__name__}, expected dict")
    score = result.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise InvalidGraderResult(f"grader returned score={score!r}, expected a finite number")
    if not 0.0 <= float(score) <= 1.0:
        raise InvalidGraderResult(f"grader returned score={score!r}, outside [0, 1]")
    passed = result.get("passed")
    if not isinstance(passed, bool):
        raise InvalidGraderResult(f"grader returned passed={passed!r}, expected bool")
    details = result.get("details", "")
    if not isinstance(details, str):
        raise InvalidGraderResult(f"grader returned details of type {type(details).__name__}, expected str")
    reason = result.get("reason", "passed" if passed else "wrong")
    if not isinstance(reason, str) or not reason or len(reason) > 64:
        raise InvalidGraderResult(f"grader returned reason={reason!r}, expected a short str")
    if len(details) > max_details_chars:
        details = details[:max_details_chars] + f"... [cut, {len(details)} chars]"
    return {"score": float(score), "passed": passed, "details": details, "reason": reason}
