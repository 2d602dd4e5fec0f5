"""Stream completion signals, the daemon's side (docs/fast-path.md).

A stream's signal is one monotonic value in its owner's notify area (simnpu.shm.notify):
the sequence number of the stream's last completed task, with DIRTY set when a synchronize
would report a failure. Clients wait on it; a synchronize it proves needs no request.

One writer at a time, decided here: the scheduler writes a stream's signal, unless it has
lent it to the unit running the stream's tail (`lend`), which writes it the moment its
batch succeeded -- one process wake-up sooner than through the scheduler thread. While it
is lent, what the scheduler would write is kept (`publish`) and written when the unit's
report comes back (`take_back`), so the value never goes down and no reader ever has to
reconcile two writers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.work import WriteSignal
from simnpu.shm import notify as layout
from simnpu.shm.region import Region

if TYPE_CHECKING:
    from simnpu.server.objects import Owner, Stream


class SignalArea:
    """The completion signals of one owner: the signal words of its notify area."""

    def __init__(self, region: Region, area: layout.NotifyArea):
        self.region = region
        self.area = area
        self._free = list(range(layout.STREAM_SLOTS - 1, -1, -1))

    def signal(self) -> StreamSignal | None:
        """A new stream's signal; None when every slot is taken."""
        return StreamSignal(self, self._free.pop()) if self._free else None

    def release(self, signal: StreamSignal) -> None:
        """The stream is gone and nothing of it runs any more: its slot may be reused."""
        self._free.append(signal.slot)


class StreamSignal:
    """One stream's signal (its slot in the owner's notify area) and who writes it."""

    __slots__ = ("_pending", "area", "lent", "slot", "value")

    def __init__(self, area: SignalArea, slot: int):
        self.area = area
        self.slot = slot
        self.value = 0  # the highest sequence number written (or to be written) for it
        self.lent = False  # a unit writes it after its batch
        self._pending: tuple[int, bool] | None = None  # what to write once it comes back

    def publish(self, seq: int, dirty: bool) -> None:
        """The stream ran (or dropped) everything up to `seq`; `dirty`: a failure waits to be
        reported. Never below what was published before."""
        seq = self.value = max(self.value, seq)
        if self.lent:
            self._pending = (seq, dirty)
        else:
            self._write(seq, dirty)

    def lend(self, seq: int) -> WriteSignal:
        """The item that has a unit write "done up to `seq`, clean" after its batch."""
        self.lent = True
        return WriteSignal(self.area.region.name, self.slot, seq)

    def take_back(self) -> None:
        """The unit reported its batch: the scheduler writes the signal again."""
        self.lent = False
        if self._pending is not None:
            (seq, dirty), self._pending = self._pending, None
            self._write(seq, dirty)

    def covers(self, seq: int) -> bool:
        """Does the signal say, clean, that every task up to `seq` has run? (a unit may have
        written it before the scheduler took its report)"""
        word = self.area.area.word(self.slot)
        return not word & layout.DIRTY and word >= seq

    def _write(self, seq: int, dirty: bool) -> None:
        area = self.area.area
        if area.word(self.slot) != (seq | layout.DIRTY if dirty else seq):
            area.set_done(self.slot, seq, dirty)


def drained(stream: Stream, seq: int) -> None:
    """The scheduler: `stream` ran (or dropped) everything up to `seq` and has nothing queued."""
    signal = stream.signal
    if signal is not None:
        signal.publish(seq, stream.failure_pending())


def rejected(owner: Owner, seq: int) -> None:
    """The scheduler, in submission order: asynchronous call `seq` of `owner` was rejected.
    Its stream may be the one the client sleeps on, waiting for `seq` that will never run:
    every signal of the owner says "done up to `seq`, ask the daemon" (which reports it)."""
    for stream in owner.streams():
        if stream.signal is not None:
            stream.signal.publish(seq, True)


def lend_for(stream: Stream, last_seq: int, observed: bool) -> WriteSignal | None:
    """At dispatch of work ending with task `last_seq`: the item that lets the unit write
    the stream's signal, when the work ends at the stream's tail and nothing needs the
    scheduler's judgement (a failure to report, STOP mode, an observed daemon)."""
    signal = stream.signal
    if (signal is None or observed or stream.tasks[-1].seq != last_seq
            or stream.context.failure_mode != codes.ACL_CONTINUE_ON_FAILURE
            or stream.failure_pending()):
        return None
    return signal.lend(last_seq)
