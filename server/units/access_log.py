"""What a checked kernel touched: the AI core's side of memory and race checking.

When the daemon checks a session (server/observation/observer.py), the bounds of each of its
launches travel as `CheckedBounds` (server/core/unit_protocol.py) instead of a plain tuple;
the worker then runs the kernel with a `RecordingContext` whose `gm` notes every view it
hands out. After each block:

- an access="r" view is a read of its bytes, an access="w" view a write of its bytes;
- an access="rw" view is a read of its bytes, and a write of the elements whose bytes
  changed (a copy is taken when the view is made and compared at the end of the block).
  A store of the value already there is therefore not seen as a write by race detection;
  initcheck counts the whole "rw" view as initialised.

Before the batch's results, the worker reports Accesses (token, entries, fault) with
entries (lo, hi, mode, first_block, last_block) in absolute device addresses, mode READ,
WRITE or READ_RW (adjacent entries of the same mode merged), and fault (address, nbytes,
access, block) when a view was refused (MemoryFault), else None. Nothing here runs unless
checking is on.
"""

from __future__ import annotations

import numpy as np

from simnpu.server.core.unit_protocol import Accesses
from simnpu.server.units.runner import KernelContext, MemoryFault

READ, WRITE, READ_RW = 0, 1, 2  # entry modes; READ_RW: a read through an "rw" view (no initcheck)
MAX_RUNS_PER_VIEW = 256  # more changed runs than this in one view: the closest are merged

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def run_checked(runner, token, function, args, first, last, block_num, bounds, saturation):
    """Run blocks [first, last) like WorkRunner.run_kernel does, recording accesses; report
    them. Returns (block reached, exception or None)."""
    entries: list = []
    fault = None
    block = first
    error = None
    for block in range(first, last):
        context = RecordingContext(
            block,
            block_num,
            runner.core_id,
            bounds,
            runner.maps,
            runner.output,
            runner.overflow,
            saturation,
        )
        try:
            function(context, *args)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            error = exc
            if isinstance(exc, MemoryFault) and exc.access is not None:
                fault = (*exc.access, block)
        context.finish(entries, block)
        if error is not None:
            break
    runner.report(Accesses.pack(token, _merge(entries), fault))
    return block, error


class RecordingContext(KernelContext):
    """A KernelContext that remembers the views it gives out."""

    __slots__ = ("_views",)

    def __init__(self, *args):
        KernelContext.__init__(self, *args)
        self._views: list = []

    def gm(self, ptr, dtype, count, access="rw"):
        try:
            view = KernelContext.gm(self, ptr, dtype, count, access)
        except MemoryFault as fault:
            fault.access = (int(ptr), int(count) * _itemsize(dtype), access)
            raise
        before = view.copy() if access == "rw" and view.nbytes else None
        self._views.append((int(ptr), view, access, before))
        return view

    def finish(self, entries: list, block: int) -> None:
        for ptr, view, access, before in self._views:
            nbytes = view.nbytes
            if not nbytes:
                continue
            if access == "r":
                entries.append((ptr, ptr + nbytes, READ, block, block))
            elif access == "w":
                entries.append((ptr, ptr + nbytes, WRITE, block, block))
            else:
                entries.append((ptr, ptr + nbytes, READ_RW, block, block))
                for lo, hi in _changed(before, view):
                    entries.append((ptr + lo, ptr + hi, WRITE, block, block))
        self._views = []


def _itemsize(dtype) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 1


def _changed(before: np.ndarray, after: np.ndarray) -> list[tuple[int, int]]:
    """Byte ranges (relative to the view) of the elements whose bytes differ."""
    size = after.dtype.itemsize
    kind = _UINT.get(size)
    if kind is None:
        size, kind = 1, np.uint8
    old = before.view(kind)
    new = after.view(kind)
    changed = np.flatnonzero(old != new)
    if changed.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(changed) != 1)
    starts = np.concatenate(([changed[0]], changed[breaks + 1]))
    ends = np.concatenate((changed[breaks], [changed[-1]])) + 1
    if starts.size > MAX_RUNS_PER_VIEW:  # keep the widest gaps, merge across the others
        gaps = starts[1:] - ends[:-1]
        keep = np.sort(np.argsort(gaps)[-(MAX_RUNS_PER_VIEW - 1) :])
        starts = np.concatenate(([starts[0]], starts[keep + 1]))
        ends = np.concatenate((ends[keep], [ends[-1]]))
    return [(int(a) * size, int(b) * size) for a, b in zip(starts, ends)]


def _merge(entries: list) -> list:
    """Entries sorted by kind and address, touching ones of the same kind merged."""
    if len(entries) < 2:
        return entries
    entries.sort(key=lambda e: (e[2], e[0]))
    merged = [list(entries[0])]
    for lo, hi, write, b0, b1 in entries[1:]:
        last = merged[-1]
        if write == last[2] and lo <= last[1]:
            last[1] = max(last[1], hi)
            last[3] = min(last[3], b0)
            last[4] = max(last[4], b1)
        else:
            merged.append([lo, hi, write, b0, b1])
    return [tuple(e) for e in merged]
