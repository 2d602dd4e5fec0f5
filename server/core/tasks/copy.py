"""A copy (aclrtMemcpyAsync, and the chunks of aclrtMemcpy) on copy engines.

A stream's copy goes whole to one copy engine, so the copies of a pipeline overlap its
kernels; a synchronous one of 8 MiB or more is split over every engine of the device
(`copy_pieces` below). Memsets are cut the same way (server/core/tasks/memset.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.server.core.executor import UnitKind
from simnpu.server.core.unit_protocol import CopyBytes, Span
from simnpu.shm.addresses import device_address

from .base import DeviceWork, Task, TaskState, size_text

if TYPE_CHECKING:
    from simnpu.server.core.executor import Unit
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream


# ---- its policies: small pure functions (tests/server/test_policy.py) ------------------------
MIN_COPY_PIECE = 4 << 20


def copy_pieces(count: int, engines: int, synchronous: bool) -> int:
    """How many copy engines share one copy or memset of `count` bytes.

    A synchronous one (aclrtMemcpy, aclrtMemset: the caller waits for it and nothing else)
    of 8 MiB or more takes all of them, so it goes faster than one memcpy. A stream's copy
    goes whole to one engine: the engines and AI cores are processes on the host's few
    CPUs, and a second piece would take the CPU of the kernel the copy should overlap
    with -- overlap being the point of putting copies on streams.
    """
    if not synchronous:
        return 1
    return max(1, min(engines, count // MIN_COPY_PIECE))


def piece_range(count: int, pieces: int, index: int) -> tuple[int, int]:
    """[start, end) of piece `index` of `pieces`, on 64-byte boundaries."""

    def edge(i: int) -> int:
        return count if i == pieces else (count * i // pieces) & ~63

    return edge(index), edge(index + 1)


class ByteRangeWork(DeviceWork):
    """Work over `count` bytes, cut into pieces for copy engines when it starts."""

    __slots__ = ("count",)
    unit_kind = UnitKind.COPY_ENGINE

    def __init__(self, seq: int, stream: Stream, count: int):
        Task.__init__(self, seq, stream)
        self.handed = self.out = 0
        self.total = 0  # how many engines share it (decided at its first hand-out)
        self.count = count

    def hand_out(
        self, scheduler: Scheduler, unit: Unit, units: int
    ) -> tuple[list, Task | None, bool]:
        if not self.total:  # the hidden stream of synchronous copies has priority -1
            self.total = copy_pieces(self.count, units, self.stream.priority < 0)
        start, end = piece_range(self.count, self.total, self.handed)
        self.handed += 1
        self.state = TaskState.DISPATCHED
        self.out += 1
        item = self.piece(scheduler.hand(unit, self), start, end)
        return [item], (self if self.total == 1 else None), self.handed == self.total

    def piece(self, token: int, start: int, end: int) -> tuple:
        """The (packed) work item for bytes [start, end)."""
        raise NotImplementedError


class CopyTask(ByteRangeWork):
    __slots__ = ("dst", "src", "staged")
    kind = "copy"

    def __init__(
        self, seq: int, stream: Stream, dst: Span, src: Span, count: int, staged: bool = False
    ):
        super().__init__(seq, stream, count)
        self.dst = dst
        self.src = src
        self.staged = staged  # a chunk of a pageable copy, through the client's staging area

    def piece(self, token: int, start: int, end: int) -> tuple:
        return CopyBytes.pack(token, self.dst.at(start), self.src.at(start), end - start)

    @property
    def direction(self) -> str:
        """H2D, D2H, D2D or H2H."""
        return f"{'D' if self.src.device >= 0 else 'H'}2{'D' if self.dst.device >= 0 else 'H'}"

    def describe(self) -> tuple[str, str, dict]:
        return f"memcpy {self.direction} {size_text(self.count)}", "copy", {"bytes": self.count}

    def timeline_entry(self) -> tuple[str | None, int]:
        return self.direction, self.count

    @property
    def blocks_host(self) -> bool:
        return self.staged or super().blocks_host

    def accesses(self) -> list[tuple]:
        return [
            span_access(span, self.count, write)
            for span, write in ((self.src, False), (self.dst, True))
            if not (self.staged and span.device < 0)
        ]  # the staging area is the client's own


def span_access(span: Span, count: int, write: bool) -> tuple:
    """A checker's access entry for `count` bytes at `span` (device memory by address)."""
    if span.device >= 0:
        start = device_address(span.device, span.offset)
        return ("dev", span.device, start, start + count, write, None)
    return ("seg", span.segment, span.offset, span.offset + count, write, None)
