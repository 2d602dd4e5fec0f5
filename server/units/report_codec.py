"""What a kernel process reports to the daemon, and the checks the daemon makes of it.

A kernel process is untrusted once it has run a kernel (docs/kernel-isolation.md): it sends
JSON, never pickle (unpickling is code execution in the daemon), at most MAX_REPORT bytes a
report (`encode_results`, `encode_accesses`), and the daemon takes nothing from it but what
`decode_report` accepts. The protocol between the two processes: the kernel process
encodes, the daemon's executor (server/units/process_executor.py) decodes.
"""

from __future__ import annotations

import json
import time
from typing import Any

from simnpu.proto import codes
from simnpu.server.core.unit_protocol import MAX_OUTPUT, Accesses

MAX_REPORT = 4 << 20
"""The longest report a kernel process may send; a longer one ends it."""
MAX_MESSAGE = 64 << 10
"""A result's message is cut to this many characters."""


class BadReport(Exception):
    """A kernel process sent something that is not a report it may send."""


def encode_results(results: list) -> bytes:
    """A batch's results (Result tuples), as a kernel process sends them."""
    return json.dumps(["results", [list(result) for result in results]]).encode()


def encode_accesses(packed: tuple) -> bytes:
    """The packed Accesses of a checked kernel, as a kernel process sends them."""
    token, entries, fault = packed
    return json.dumps(["accesses", token, entries, fault]).encode()


def decode_report(data: bytes, expected: list[int], sent_ns: int) -> Any:
    """A kernel process's report as the scheduler takes it: the list of result tuples of
    the batch (their tokens exactly `expected`, in order; times clamped to since the batch
    was sent; messages cut to MAX_MESSAGE characters, any lone surrogate replaced, device
    output cut to MAX_OUTPUT characters) or the
    packed `Accesses` of one of its tokens. Raises BadReport."""
    try:
        report = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise BadReport(f"not JSON: {error}") from None
    if not isinstance(report, list) or not report:
        raise BadReport("not a report")
    if report[0] == "results" and len(report) == 2 and isinstance(report[1], list):
        return _results(report[1], expected, sent_ns)
    if report[0] == "accesses" and len(report) == 4:
        return _accesses(report[1], report[2], report[3], expected)
    raise BadReport("not a report")


_KERNEL_CODES = (0, codes.ACL_ERROR_RT_AICORE_EXCEPTION, codes.ACL_ERROR_RT_DEVICE_MEM_ERROR)


def _is_int(value: object) -> bool:
    return value.__class__ is int


def _results(results: list, expected: list[int], sent_ns: int) -> list[tuple]:
    if len(results) != len(expected):
        raise BadReport(f"{len(results)} results for a batch of {len(expected)} kernels")
    now = time.monotonic_ns()
    out = []
    for result, token in zip(results, expected):
        if not (isinstance(result, list) and len(result) == 8):
            raise BadReport(
                "a result is not (token, code, start, end, message, output, overflow, failed)"
            )
        got, code, start, end, message, output, overflow, failed = result
        if (
            got != token
            or not all(map(_is_int, (code, start, end, failed)))
            or overflow.__class__ is not bool
        ):
            raise BadReport("a result names another task or is not numbers")
        if not isinstance(message, str) or not isinstance(output, str):
            raise BadReport("a result's message or output is not text")
        if code not in _KERNEL_CODES:
            code = codes.ACL_ERROR_RT_AICORE_EXCEPTION
        start = min(max(start, sent_ns), now)
        end = min(max(end, start), now)
        if message:  # a lone surrogate could not go into the client's reply: "?" instead
            message = message[:MAX_MESSAGE].encode("utf-8", "replace").decode("utf-8")
        out.append((token, code, start, end, message, output[:MAX_OUTPUT], overflow, failed))
    return out


def _accesses(token: object, entries: object, fault: object, expected: list[int]) -> tuple:
    if token not in expected or not isinstance(entries, list):
        raise BadReport("accesses of another task")
    checked = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 5 and all(map(_is_int, entry))):
            raise BadReport("an access is not (lo, hi, write, first block, last block)")
        checked.append(tuple(entry))
    if fault is not None:
        if not (
            isinstance(fault, list)
            and len(fault) == 4
            and _is_int(fault[0])
            and _is_int(fault[1])
            and fault[2] in ("r", "w", "rw")
            and _is_int(fault[3])
        ):
            raise BadReport("a fault is not (address, bytes, access, block)")
        fault = tuple(fault)
    return Accesses.pack(token, checked, fault)
