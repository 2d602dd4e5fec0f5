"""What every task is: one entry of a stream, with the life cycle the scheduler drives.

    submitted()   in stream order, at submission (an event record becomes its event's latest)
    start()       its stream reached it: the scheduler runs control tasks here; device work
                  is queued for units (DeviceWork) and completes when its last piece does
    discarded()   it was dropped before it ran (force destroy, STOP mode, session end)
    stop()        device work its session left running: nothing more of it is handed out
    requeue()     device work handed to a unit that was ended before it started (a launch
                  queued behind the stream's head on the same core, aclrtStreamStop)

The scheduler completes a task with `Scheduler.complete`. A task kind says what it is on
the timeline (`describe`) and what memory it touches for the checkers (`accesses`).
"""

from __future__ import annotations

import copyreg
import enum
from collections.abc import Container
from typing import TYPE_CHECKING, ClassVar, Protocol

from simnpu.server.core.executor import UnitKind
from simnpu.server.core.streams import Failure

if TYPE_CHECKING:
    from simnpu.server.core.executor import Unit
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.unit_protocol import Span


class TaskState(enum.IntEnum):
    PENDING = 0  # queued on its stream
    DISPATCHED = 1  # handed to units, or waiting for something outside its stream
    DONE = 2


class Task:
    """One task of a stream. `seq` is the client's sequence number of the call that made it."""

    __slots__ = (
        "failure",
        "limits_from",
        "probe",
        "seq",
        "state",
        "stream",
        "timestamp",
        "waiters",
    )
    kind: ClassVar[str]  # its kind on the timeline
    moves_clock: ClassVar[bool] = False  # its end moves its stream's clock (it ran somewhere)
    timed: ClassVar[bool] = False  # its timestamp is when it ended (it ran on units, or with peers)
    capturable: ClassVar[bool] = True  # a stream in capture may record it (docs/graph-capture.md)

    def __init__(self, seq: int, stream: Stream):
        self.seq = seq
        self.stream = stream
        self.state = TaskState.PENDING
        self.failure: Failure | None = None
        self.timestamp = 0  # when it ended (device clock); records: when the stream reached them
        self.waiters: list = []  # Waiters and streams to re-check when it completes
        # what a subscriber that follows it keeps on it (server/core/subscriber.py): the
        # scheduler tells subscribers it completes only if it is true
        self.probe: object = None
        # a launch of a thread using another stream's resource limits: that stream, whose
        # core limit bounds it instead of its own stream's (aclrtUseStreamResInCurrentThread)
        self.limits_from: Stream | None = None

    @property
    def owners(self) -> tuple[Owner, ...]:
        """The clients whose memory it may touch on units: its stream's (Scheduler.holds)."""
        return (self.stream.owner,)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.seq}>"

    def submitted(self) -> None:
        """At submission, in stream order, before anything of it runs."""

    def start(self, scheduler: Scheduler) -> bool:
        """Its stream reached it. True: it is done (the scheduler completes it); False: it
        completes later (device work, a wait for another stream, the client, other ranks)."""
        raise NotImplementedError

    def discarded(self, scheduler: Scheduler) -> None:
        """It was dropped before it ran."""

    def replica(self, stream: Stream) -> Task:
        """A fresh copy of this recorded task (one that never ran) on `stream`: what a replay
        of its graph submits (server/graphs/capture.py). It keeps the captured call's `seq`, so a
        failure names the call site where it was captured."""
        twin = object.__new__(type(self))
        for name in _slot_names(type(self)):
            setattr(twin, name, getattr(self, name))
        twin.stream = stream
        twin.waiters = []
        return twin

    def forgotten(self) -> None:
        """This recorded task's graph (or the capture that recorded it) is gone: release
        what it holds."""

    def follows(self) -> Task | None:
        """The task of another stream this one waited for (a wait: its record), if any."""
        return None

    def fail(self, code: int, message: str) -> None:
        """Keep the task's first failure."""
        if self.failure is None:
            self.failure = Failure(code, message, self.seq)

    def describe(self) -> tuple[str, str, dict]:
        """(name, category, extra args) on the timeline."""
        return self.kind, self.kind, {}

    def timeline_entry(self) -> tuple[str | None, int]:
        """(name, size) its submission is recorded with (server/observation/timeline.py)."""
        return None, 0

    def record_accesses(self) -> None:
        """Checking is on for its owner: have its units report what it touches (kernels)."""

    def accesses(self) -> list[tuple]:
        """(space, key, lo, hi, mode, blocks) of the memory it touched, for the checkers
        (server/observation/memcheck.py): "dev", device, device addresses; or "seg", segment,
        offsets."""
        return []

    @property
    def blocks_host(self) -> bool:
        """Whether the client's host waits for this task before going on (a synchronous
        copy or memset, a chunk of a copy through the staging area)."""
        return self.stream.handle == 0


class DeviceWork(Task):
    """A task that runs on units of its kind, handed out in pieces (blocks of a launch, byte
    ranges of a copy); it completes when the last piece reported. Its kind's __init__ sets
    `handed`, `out` and `total`."""

    __slots__ = ("handed", "out", "total")
    unit_kind: ClassVar[UnitKind]
    moves_clock = True
    timed = True
    timeout_s: float | None = None  # its own operator timeout (None: its session's)
    handed: int  # pieces handed out so far (kernels: blocks)
    out: int  # pieces out and not reported yet
    total: int  # pieces in all (a copy's are decided at its first hand-out)

    def start(self, scheduler: Scheduler) -> bool:
        scheduler.make_ready(self.stream, self.unit_kind)
        return False

    def hand_out(
        self, scheduler: Scheduler, unit: Unit, units: int
    ) -> tuple[list, Task | None, bool]:
        """The (packed) items of the next piece for `unit` (one of `units` of its kind):
        (items, the last task whose whole work these items hold or None, whether nothing is
        left to hand out)."""
        raise NotImplementedError

    @property
    def tenant(self) -> Owner | None:
        """The client whose own code its items run (in that client's kernel processes,
        server/units/kernel_processes.py); None: daemon code, run by trusted workers."""
        return None

    def stop(self) -> bool:
        """Its session ended while it ran: nothing more of it is handed out (the pieces out
        still report). True if none is out: it is done."""
        self.total = self.handed
        return not self.out

    def requeue(self) -> None:
        """It was handed out whole and its unit was ended before it started: it is queued
        again, to be handed out afresh."""
        self.state = TaskState.PENDING
        self.handed = self.out = 0

    def failed_at(self, index: int) -> None:
        """A unit's result names kernel `index` of the piece as the one that failed: only a
        run of kernels has several (server/core/tasks/kernel_run.py); a kernel process may claim
        anything, so the others ignore it."""

    def piece_done(self, scheduler: Scheduler, code: int, end_ns: int, message: str) -> None:
        """A unit reported a piece (or was lost with it)."""
        if code and self.failure is None:
            self.failure = Failure(code, message, self.seq)
        if end_ns > self.timestamp:
            self.timestamp = end_ns
        self.out -= 1
        if not self.out and self.handed >= self.total:
            scheduler.complete(self)

    @property
    def what(self) -> str:
        """How a lost unit's message names it."""
        return self.kind


class OwnMemory(Protocol):
    """The device memory of the client a task belongs to, as tasks that hold some use it
    (server/memory/client_memory.py)."""

    @property
    def allocations(self) -> Container[int]:
        """The device addresses of the client's own live blocks."""

    def free(self, address: int) -> None:
        """aclrtFree of one of its own blocks (NpuError if it went since)."""

    def own_allocation(self, address: int) -> tuple[int, int] | None:
        """(start, requested size) of the allocation holding `address` that the client may
        use, if any."""

    def span(self, address: int) -> Span:
        """Device memory at `address`, as units name it."""


def size_text(n: int) -> str:
    """A byte count as people read it (in what tasks say they are): 1.5 MiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} B"


_SLOTS: dict[type, list[str]] = {}


def _slot_names(cls: type) -> list[str]:
    """Every slot of a task class, its bases' too (cached)."""
    names = _SLOTS.get(cls)
    if names is None:
        names = _SLOTS[cls] = copyreg._slotnames(cls)  # type: ignore[attr-defined]
    return names
