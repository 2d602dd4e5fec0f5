"""The protocol between the scheduler and its units (AI cores, copy engines): the items of
a batch, and what a unit reports back. Everything here pickles: it crosses a pipe to the
worker processes (server/workers.py).

A batch is a list of items that the unit runs in order. Items with a `token` report one
`Result` each; the others (LoadModule, ForgetSegment, WriteSignal) report nothing. While a
batch runs the scheduler may send `Cancel`: kernels of the batch not started yet are
skipped (reported done, without running). A unit reports `Ready` once it can take work,
and `Accesses` of a checked kernel before the batch's results.

Times are CLOCK_MONOTONIC nanoseconds, which the daemon and its workers share: the
device's clock.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Span(NamedTuple):
    """Where bytes are: `offset` into the shared-memory segment `segment`, which is device
    `device`'s memory (device >= 0) or a host segment: pinned memory, a staging area (-1)."""

    segment: str
    offset: int
    device: int = -1

    def at(self, delta: int) -> Span:
        return Span(self.segment, self.offset + delta, self.device)


# ---- scheduler -> unit ------------------------------------------------------------------------
class LoadModule(NamedTuple):
    """Execute a kernel module once on this unit and keep it (before its first launch)."""

    binary: int  # daemon-wide binary id
    source: str
    filename: str


class ForgetSegment(NamedTuple):
    """A host segment was unlinked: drop the unit's mapping of it."""

    name: str


class WriteSignal(NamedTuple):
    """Write a stream's completion signal and wake its waiters -- only if every item of the
    batch before this one succeeded and ran (docs/fast-path.md)."""

    segment: str  # the owner's notify area
    slot: int
    seq: int


class RunKernel(NamedTuple):
    """Blocks [first, last) of a launch of `name` from binary `binary`."""

    token: int
    binary: int
    name: str
    args: tuple
    first: int
    last: int
    num_blocks: int
    bounds: tuple  # (start, size) of the allocations it may touch (CheckedBounds: record them)


class CopyBytes(NamedTuple):
    token: int
    dst: Span
    src: Span
    count: int


class FillBytes(NamedTuple):
    token: int
    dst: Span
    value: int
    count: int


class ReducePiece(NamedTuple):
    """A share of a matched HCCL collective's data movement (server/reduce.py)."""

    token: int
    dtype: str
    op: int
    groups: list
    snapshot: bool
    piece: list


class Cancel(NamedTuple):
    """Skip these kernels of the running batch if they have not started."""

    tokens: list[int]


# ---- unit -> scheduler --------------------------------------------------------------------------
class Result(NamedTuple):
    token: int
    code: int  # an ACL code; 0: success
    start_ns: int
    end_ns: int
    message: str


class Ready(NamedTuple):
    """The unit can take work."""


class Accesses(NamedTuple):
    """What a checked kernel touched (server/access_log.py)."""

    token: int
    entries: list
    fault: Any  # (address, nbytes, access, block) of a refused view, or None
