"""The protocol between the scheduler and its units (AI cores, copy engines): the items of
a batch, and what a unit reports back.

A batch is a list of items that the unit runs in order. Items with a `token` report one
result each; the others (LoadModule, ForgetSegment, WriteSignal, MapWindows, MapBacking)
report nothing. While a batch runs the scheduler may send `Cancel`: kernels of the batch
not started yet are skipped (reported done, without running), and a kernel running a chunk
of blocks starts no more of them (its session ended). A unit reports `Ready` once it can take work,
and `Accesses` of a checked kernel before the batch's results.

Items and results are the hot path to the units, so they travel as the command records of
simnpu.proto.commands do: each kind is a named tuple of its fields with `pack(*fields)`,
the plain tuple that crosses the pipe (its TAG first), and `unpack(packed)`. Pickle would
spend about 3 µs each way on every named tuple's class, as much as the rest of a
one-kernel batch costs. Everything here pickles: it crosses a pipe to the worker processes
(server/units/worker_main.py). Times are CLOCK_MONOTONIC nanoseconds, which the daemon and its
workers share: the device's clock.

A client's kernel processes are granted the device memory they may map (`Grant`): whole
pages of its allocations and its mappings, computed by the client's memory and handed by
the daemon's book of kernel processes to each process it forks.
"""

from __future__ import annotations

import mmap
import select
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, ClassVar, NamedTuple

DAEMON_GONE = (EOFError, ConnectionResetError)
"""What a unit's `recv` raises once the daemon's end of its pipe is gone: end of file, or a
reset when the daemon died with reports of the unit unread (a socketpair's peer closed
with data in its queue)."""


class Span(NamedTuple):
    """Where bytes are: `offset` into the shared-memory segment `segment`, which is device
    `device`'s memory (device >= 0) or a host segment: pinned memory, a staging area (-1)."""

    segment: str
    offset: int
    device: int = -1

    def at(self, delta: int) -> Span:
        return Span(self.segment, self.offset + delta, self.device)


class _Item:
    """pack / unpack of a work item kind (mixed into its named tuple)."""

    __slots__ = ()
    TAG: ClassVar[int]

    @classmethod
    def pack(cls, *fields: Any) -> tuple:
        """The item as it travels: its TAG, then its fields in order."""
        return (cls.TAG, *fields)

    @classmethod
    def unpack(cls, packed: tuple) -> Any:
        # cls is always a named tuple that mixes this in (mypy sees only _Item): ignore type-var
        return tuple.__new__(cls, packed[1:])  # type: ignore[type-var]


# ---- scheduler -> unit ------------------------------------------------------------------------
class _LoadModuleFields(NamedTuple):
    binary: int  # daemon-wide binary id
    source: str
    filename: str


class LoadModule(_LoadModuleFields, _Item):
    """Execute a kernel module once on this unit and keep it (before its first launch)."""

    __slots__ = ()
    TAG = 0


class _ForgetSegmentFields(NamedTuple):
    name: str


class ForgetSegment(_ForgetSegmentFields, _Item):
    """A host segment was unlinked: drop the unit's mapping of it."""

    __slots__ = ()
    TAG = 1


class _WriteSignalFields(NamedTuple):
    segment: str  # the owner's notify area
    slot: int
    seq: int


class WriteSignal(_WriteSignalFields, _Item):
    """Write a stream's completion signal and wake its waiters -- only if every item of the
    batch before this one succeeded and ran (docs/fast-path.md)."""

    __slots__ = ()
    TAG = 2


class CheckedBounds(tuple):
    """The bounds of a launch whose accesses the unit must record (server/units/access_log.py;
    a plain tuple otherwise)."""

    __slots__ = ()

    def __reduce__(self):
        return (CheckedBounds, (tuple(self),))


class _RunKernelFields(NamedTuple):
    token: int
    binary: int
    name: str
    args: tuple
    first: int
    last: int
    num_blocks: int
    bounds: tuple  # (start, size) of the allocations it may touch (CheckedBounds: record them)
    saturation: bool  # its stream's float results saturate (ctx.saturation)


class RunKernel(_RunKernelFields, _Item):
    """Blocks [first, last) of a launch of `name` from binary `binary`."""

    __slots__ = ()
    TAG = 3


class _CopyBytesFields(NamedTuple):
    token: int
    dst: Span
    src: Span
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as named tuples allow


class CopyBytes(_CopyBytesFields, _Item):
    __slots__ = ()
    TAG = 4

    @classmethod
    def pack(cls, token: int, dst: Span, src: Span, count: int) -> tuple:
        return (cls.TAG, token, tuple(dst), tuple(src), count)

    @classmethod
    def unpack(cls, packed: tuple) -> CopyBytes:
        return cls(packed[1], Span(*packed[2]), Span(*packed[3]), packed[4])


class _FillBytesFields(NamedTuple):
    token: int
    dst: Span
    value: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as named tuples allow


class FillBytes(_FillBytesFields, _Item):
    __slots__ = ()
    TAG = 5

    @classmethod
    def pack(cls, token: int, dst: Span, value: int, count: int) -> tuple:
        return (cls.TAG, token, tuple(dst), value, count)

    @classmethod
    def unpack(cls, packed: tuple) -> FillBytes:
        return cls(packed[1], Span(*packed[2]), packed[3], packed[4])


class _ReducePieceFields(NamedTuple):
    token: int
    dtype: str
    op: int
    groups: list  # server/hccl/reduce_plan.py's plan
    snapshot: bool
    piece: list


class ReducePiece(_ReducePieceFields, _Item):
    """A share of a matched HCCL collective's data movement (planned by
    server/hccl/reduce_plan.py, run by server/units/collective_pieces.py)."""

    __slots__ = ()
    TAG = 6


REDUCE_BLOCK_BYTES = 1 << 19
"""A unit runs a ReducePiece in blocks of this many bytes of each source, so that the
running result stays in L2; the daemon spawns its units with glibc's non-temporal copy
threshold at this size (server/units/spawning.py), so that copying a block into a
destination does not first read it (512 KiB against 1 MiB: reduce_scatter of 64 MiB over 4
ranks +6 % out of place and +15 % in place, nothing slower;
docs/decisions/collective-blocks-of-512-kib.md)."""


class _ReduceBytesFields(NamedTuple):
    token: int
    dst: Span
    src: Span
    count: int  # type: ignore[assignment]  # bytes; the field shadows tuple.count
    kind: int  # aclrtReduceKind
    dtype: str  # numpy dtype name
    saturation: bool  # its stream's float results saturate (server/units/reduce_async.py)


class ReduceBytes(_ReduceBytesFields, _Item):
    """dst = dst (op) src element-wise (aclrtReduceAsync; server/units/reduce_async.py)."""

    __slots__ = ()
    TAG = 7

    @classmethod
    def pack(
        cls, token: int, dst: Span, src: Span, count: int, kind: int, dtype: str, saturation: bool
    ) -> tuple:
        return (cls.TAG, token, tuple(dst), tuple(src), count, kind, dtype, saturation)

    @classmethod
    def unpack(cls, packed: tuple) -> ReduceBytes:
        return cls(packed[1], Span(*packed[2]), Span(*packed[3]), *packed[4:])


class _RandomNumbersFields(NamedTuple):
    token: int
    func_type: int  # aclrtRandomNumFuncType
    dtype: str  # numpy dtype name
    result: Span
    room: int  # bytes of the result's allocation from `result` on
    counter: Span  # the 16-byte Philox counter
    parameters: tuple  # per parameter: (bytes, size) of a value, or (Span,) to read
    seed: tuple  # the same
    num: tuple  # the same


class RandomNumbers(_RandomNumbersFields, _Item):
    """A random number task (aclrtRandomNumAsync; server/units/random_numbers.py). Spans travel
    as plain tuples inside `parameters`, `seed` and `num`."""

    __slots__ = ()
    TAG = 8

    @classmethod
    def pack(
        cls,
        token: int,
        func_type: int,
        dtype: str,
        result: Span,
        room: int,
        counter: Span,
        parameters: tuple,
        seed: tuple,
        num: tuple,
    ) -> tuple:
        return (
            cls.TAG,
            token,
            func_type,
            dtype,
            tuple(result),
            room,
            tuple(counter),
            parameters,
            seed,
            num,
        )

    @classmethod
    def unpack(cls, packed: tuple) -> RandomNumbers:
        token, func_type, dtype, result, room, counter, parameters, seed, num = packed[1:]
        return cls(
            token, func_type, dtype, Span(*result), room, Span(*counter), parameters, seed, num
        )


class _RunKernelsFields(NamedTuple):
    token: int
    kernels: tuple  # (binary, name, args, bounds, saturation) of each single-block launch
    stop: bool  # end at the first kernel that fails (its stream's STOP failure mode)


class RunKernels(_RunKernelsFields, _Item):
    """A run of single-block launches, in order, reported as one result: a replay's kernels
    between two other tasks of one stream (server/core/tasks/kernel_run.py). A failure is that of
    the first kernel that failed, `Result.failed` its index; cancelled, the rest is skipped."""

    __slots__ = ()
    TAG = 9


class _MapWindowsFields(NamedTuple):
    # every device's mappings of physical blocks at reserved addresses (aclrtMapMem):
    # and of registered host memory: (device, reserved offset, length, source offset,
    # source: simnpu.shm.window.Entry), whole pages
    windows: tuple[tuple[int, int, int, int, str], ...]


class MapWindows(_MapWindowsFields, _Item):
    """The reserved halves of the unit's device windows map exactly these blocks now
    (docs/device-memory.md): sent before a batch when the table changed since the unit
    last saw it."""

    __slots__ = ()
    TAG = 10


class _MapBackingFields(NamedTuple):
    # (device segment, offset, length, source): page run [offset, +length) of the device
    # is mapped from the segment `source` at the same offset, in this order
    # (server/memory/device_backing.py's Backing)
    changes: tuple[tuple[str, int, int, str], ...]


class MapBacking(_MapBackingFields, _Item):
    """The device windows' page runs now come from these files (a client's blocks live in
    a file of its own: docs/kernel-isolation.md): sent before a batch with what changed
    since the unit last saw the daemon's log."""

    __slots__ = ()
    TAG = 11


ITEMS: tuple[type, ...] = (
    LoadModule,
    ForgetSegment,
    WriteSignal,
    RunKernel,
    CopyBytes,
    FillBytes,
    ReducePiece,
    ReduceBytes,
    RandomNumbers,
    RunKernels,
    MapWindows,
    MapBacking,
)
"""Every item kind, by TAG."""
assert all(kind.TAG == tag for tag, kind in enumerate(ITEMS))  # type: ignore[attr-defined]


class Cancel(NamedTuple):
    """Skip these kernels of the running batch if they have not started, and the blocks
    not started of the one running."""

    tokens: list[int]


def next_message(conn: Connection, incoming: select.poll) -> Any:
    """A unit's next message from the daemon on `conn` (a batch, a late Cancel, None: stop),
    with `incoming` polling it. Blocks; one of DAEMON_GONE if the daemon's end is gone.

    The unit sleeps in poll(), not in recv(): the kernel wakes a thread blocked in recv()
    on a Unix socket whenever room to write frees up on it, which is every time the daemon
    reads a report from the other end -- a wake-up of the unit per batch, for nothing.
    poll() is woken only by what it waits for."""
    incoming.poll()
    return conn.recv()


# ---- unit -> scheduler --------------------------------------------------------------------------
TASK_SPACE = 64 << 10
"""Characters (DumpHead lines included) one piece of a launch may print into its Result's
output (server/units/device_printf.py); the unit cuts the rest."""
MAX_OUTPUT = TASK_SPACE + 1024
"""The longest output a kernel process may report for one result (decode_report cuts it),
and what the daemon keeps of all the pieces of one launch (server/core/owner.py)."""
INCOMPLETE = "Remain block space is not enough, printing information may be incomplete!\n"
"""The line that says a launch's output was cut, as the real dump parser prints it."""


class Result(NamedTuple):
    """What a unit reports of an item with a token: a batch's results are a list of them."""

    token: int
    code: int  # an ACL code; 0: success
    start_ns: int
    end_ns: int
    message: str
    output: str = ""  # what the kernel printed (server/units/device_printf.py), formatted
    overflow: bool = False  # the kernel raised the overflow flag (server/units/float_overflow.py)
    failed: int = 0  # a RunKernels item: the index of the kernel that failed


def pack_results(results: list[Result]) -> list[tuple]:
    """A batch's results as they travel: plain tuples, their fields in order (the scheduler
    takes either)."""
    return [tuple(result) for result in results]


class Ready(NamedTuple):
    """The unit can take work."""


class Accesses(NamedTuple):
    """What a checked kernel touched (server/units/access_log.py). It travels as the plain tuple of
    its fields (`pack`): pickling a named tuple costs microseconds each way."""

    token: int
    entries: list
    fault: Any  # (address, nbytes, access, block) of a refused view, or None

    @staticmethod
    def pack(token: int, entries: list, fault: Any) -> tuple:
        return (token, entries, fault)


# ---- what a client's kernel processes map ---------------------------------------------------
PAGE = mmap.PAGESIZE
PageSpan = tuple[int, int, int]  # (device, offset, length): whole pages of a device's segment
Mapping = tuple[int, int, int, int, str]
"""(device, device offset, length, source offset, source): whole pages of the segment
`source` mapped at a device offset -- a block at its own offset in the file of its owner's
memory (server/memory/device_backing.py), a physical block at a reserved address
(aclrtMapMem), registered host memory at its alias."""


@dataclass(frozen=True)
class Grant:
    """The device memory a client's kernel processes map: the device ranges they reach
    (`spans`: whole pages, sorted and merged), and the segments they map there
    (`mappings`). `generation` changes whenever the client's memory does."""

    generation: int
    spans: tuple[PageSpan, ...]
    mappings: tuple[Mapping, ...] = ()


def page_spans(ranges: Iterable[PageSpan]) -> tuple[PageSpan, ...]:
    """(device, offset, length) byte ranges as sorted, merged, page-aligned spans."""
    spans: list[list[int]] = []
    for device, offset, length in sorted(
        (d, o & -PAGE, ((o + n + PAGE - 1) & -PAGE) - (o & -PAGE)) for d, o, n in ranges if n > 0
    ):
        last = spans[-1] if spans else None
        if last is not None and last[0] == device and offset <= last[1] + last[2]:
            last[2] = max(last[2], offset + length - last[1])
        else:
            spans.append([device, offset, length])
    return tuple((d, o, n) for d, o, n in spans)
