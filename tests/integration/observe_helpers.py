"""Kernels and helpers shared by the observability tests (test_memcheck, test_races,
test_timeline)."""

from __future__ import annotations

import sys

KERNELS = '''
import time

import numpy as np
from simnpu import kernel


@kernel("ptr", "ptr", "u32")
def double(ctx, x, y, n):
    """y = 2 x: x read-only, y write-only."""
    np.multiply(ctx.gm(x, "float32", n, access="r"), 2, out=ctx.gm(y, "float32", n, access="w"))


@kernel("ptr", "u32")
def inc(ctx, x, n):
    """x += 1 through an "rw" view."""
    view = ctx.gm(x, "float32", n)
    view += 1


@kernel("ptr", "u32")
def peek(ctx, x, n):
    """Asks for "rw" but only reads."""
    float(ctx.gm(x, "float32", n).sum())


@kernel("ptr", "u32", "f64")
def slow_fill(ctx, x, n, seconds):
    """Sleep, then x[:] = 1 (write-only)."""
    time.sleep(seconds)
    ctx.gm(x, "float32", n, access="w")[:] = 1


@kernel("ptr", "u32", "u32", "f64")
def rendezvous(ctx, flags, mine, other, limit):
    """Set my flag, wait for the other's: completes only if both kernels run at once."""
    ctx.gm(flags, "int32", 8)[mine] = 1
    view = ctx.gm(flags, "int32", 8, access="r")
    deadline = time.monotonic() + limit
    while view[other] == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the other kernel never ran at the same time")
        time.sleep(0.0005)
'''

NAMES = ("double", "inc", "peek", "slow_fill", "rendezvous")


def kernels(npu) -> dict:
    module = npu.Module.from_source(KERNELS, "observe_kernels.py")
    return {name: module.function(name) for name in NAMES}


def next_line() -> str:
    """file:line of the line after the caller's: the call site the checkers should name."""
    frame = sys._getframe(1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno + 1}"


def found(report: dict, check: str | None = None, kind: str | None = None) -> list[dict]:
    return [
        f
        for f in report["findings"]
        if (check is None or f["check"] == check) and (kind is None or f["kind"] == kind)
    ]


def sites(finding: dict) -> list[str]:
    return [task["site"] for task in finding.get("tasks", ())]
