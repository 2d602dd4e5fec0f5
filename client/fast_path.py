"""The client's end of a session's fast path (docs/fast-path.md): mapping its notify area
and submission ring, and aclrtSynchronizeStream decided on a stream's completion signal.

A stream's signal holds the sequence number of the stream's last completed task, with DIRTY
set when a synchronize would report a failure (shm/notify.py's StreamSignal). If the
stream's last command is this process's latest call whose failure is reported later, a
clean signal at or past it means "done, and nothing to report"; a dirty one means the daemon
must be asked.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from simnpu.shm import futex
from simnpu.shm.notify import DIRTY, SEQ_MASK, NotifyArea
from simnpu.shm.region import Region
from simnpu.shm.ring import SubmissionRing

_SLICE_S = 0.1  # how often a sleeping synchronize re-checks that the session is alive
POLL_S = 200e-6
"""How long a synchronize polls its signal before it sleeps on it, as the real runtime
queries a stream's task status a few times before it waits for the device's interrupt:
about two of this device's shortest round trips (a launch + synchronize of an empty
kernel, ~100 µs), so a wait on short work ends without a futex sleep and a wake-up. A
stream whose last wait took longer than this sleeps at once: its work is not short, and
polling would only take CPU from the units running it."""
FAST_SYNC_POLL_S = 0.02
"""How long a synchronize polls on a stream created with ACL_STREAM_FAST_SYNC, which asks
aclrtSynchronizeStream to poll the task status rather than wait for a notification (the
real runtime: up to 200,000 queries): lower latency for work up to this long, paid in CPU."""


class StreamSignals:
    """The completion signals of one session's streams, as the client sees them, and the
    calls they decide without a request: stream and event synchronize and query, device
    synchronize (docs/fast-path.md says when each may)."""

    def __init__(self, connection, area):
        self.connection = connection
        self.area = area
        self.slots: dict[int, int] = {}  # stream handle -> its signal's slot
        self.fast_sync: set[int] = set()  # streams created with ACL_STREAM_FAST_SYNC
        self.long_waits: set[int] = set()  # streams whose last wait outlasted POLL_S
        self.records: dict[int, tuple[int, int]] = {}  # event -> (stream, seq) of its latest record
        self.models = False  # this process made a model run instance (client/runtime_graphs.py)
        self.decided = 0  # calls decided here, without a request (a statistic)

    def add(self, stream: int, slot: int, fast_sync: bool = False) -> None:
        self.slots[stream] = slot
        if fast_sync:
            self.fast_sync.add(stream)

    def remove(self, stream: int) -> None:
        self.slots.pop(stream, None)
        self.fast_sync.discard(stream)
        self.long_waits.discard(stream)
        self.connection.log.stream_seq.pop(stream, None)

    def recorded(self, event: int, stream: int, seq: int) -> None:
        """aclrtRecordEvent `seq` made `stream`'s record the event's latest."""
        self.records[event] = (stream, seq)

    def forget(self, event: int) -> None:
        """The event's latest record is not known here any more (reset, destroyed)."""
        self.records.pop(event, None)

    def _last_command(self, stream: int) -> tuple[int, int] | None:
        """(slot, seq) of `stream`'s signal and last command if that command is this
        process's latest call whose failure is reported later: a clean signal at or past it
        then proves every earlier call ran or was reported."""
        slot = self.slots.get(stream)
        log = self.connection.log
        seq = log.stream_seq.get(stream)
        if slot is None or seq is None or seq != log.deferred_seq:
            return None
        return slot, seq

    def _covers(self, slot: int, seq: int) -> bool:
        """Signal `slot` is clean and at or past `seq`."""
        word = self.area.word(slot)
        return not word & DIRTY and word >= seq

    def _poll_s(self, stream: int) -> float:
        """How long a wait on `stream` polls before it sleeps: FAST_SYNC_POLL_S on an
        ACL_STREAM_FAST_SYNC stream; else POLL_S, or nothing after a wait that outlasted it."""
        if stream in self.fast_sync:
            return FAST_SYNC_POLL_S
        return 0.0 if stream in self.long_waits else POLL_S

    def _wait(
        self,
        stream: int,
        slot: int,
        seq: int,
        deadline: float | None,
        still: Callable[[], bool] | None = None,
    ) -> bool | None:
        """Wait for `stream`'s signal, `slot`, to reach `seq` -- polling it (`_poll_s`),
        yielding the CPU between looks, then sleeping on it: True if it did clean; False if
        dirty, the session broke, or `still()` no longer holds (the daemon must be asked);
        None at the monotonic `deadline`. Blocks."""
        word = self.area.word(slot)
        if word & SEQ_MASK >= seq:
            return not word & DIRTY
        started = time.monotonic()
        try:
            return self._wait_from(word, slot, seq, deadline, started + self._poll_s(stream), still)
        finally:
            if time.monotonic() - started > POLL_S:
                self.long_waits.add(stream)
            else:
                self.long_waits.discard(stream)

    def _wait_from(
        self,
        word: int,
        slot: int,
        seq: int,
        deadline: float | None,
        polled_until: float,
        still: Callable[[], bool] | None,
    ) -> bool | None:
        """_wait once it saw `word`, short of `seq`: polling until `polled_until`."""
        area, connection = self.area, self.connection
        connection.ring_doorbell()  # before waiting: a wake-up of the daemon the launch missed
        while True:
            if connection.broken is not None or (still is not None and not still()):
                return False  # the request raises the session's error, or decides
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            if now < polled_until:
                os.sched_yield()  # (without the GIL: the process's other threads run)
            else:
                slice_s = _SLICE_S if deadline is None else min(_SLICE_S, deadline - now)
                area.wait_word(slot, word, slice_s)
            word = area.word(slot)
            if word & SEQ_MASK >= seq:
                return not word & DIRTY

    def _outcome(self, outcome: bool | None, timeout_ms: int) -> int | None:
        """What a synchronize tells its caller: None decided (success), else the timeout (ms)
        to ask the daemon with, 0 when the wait used it up."""
        if outcome is None:
            return 0
        if outcome:
            self.decided += 1
            return None
        return timeout_ms

    def synchronize(self, stream: int, timeout_ms: int) -> int | None:
        """aclrtSynchronizeStream(WithTimeout) on `stream`'s signal, if that can decide it:
        None when it did (success), else the timeout (ms) to ask the daemon with, 0 when
        this wait used up `timeout_ms`. Blocks."""
        last = self._last_command(stream)
        if last is None or timeout_ms < -1:
            return timeout_ms
        slot, seq = last
        outcome = self._wait(stream, slot, seq, _deadline(timeout_ms))
        return self._outcome(outcome, timeout_ms)

    def stream_complete(self, stream: int) -> bool:
        """aclrtStreamQuery: True when `stream`'s signal proves its work done with nothing to
        report; False when the daemon must answer (running, failed, or unknown here)."""
        last = self._last_command(stream)
        if last is None or not self._covers(*last):
            return False
        self.decided += 1
        return True

    def event_complete(self, event: int) -> bool:
        """aclrtQueryEventStatus: True when the signal of the stream of the event's latest
        record proves it ran, with no failure before it; False: the daemon must answer."""
        record = self.records.get(event)
        slot = None if record is None else self.slots.get(record[0])
        if record is None or slot is None or not self._covers(slot, record[1]):
            return False
        self.decided += 1
        return True

    def synchronize_event(self, event: int, timeout_ms: int) -> int | None:
        """aclrtSynchronizeEvent(WithTimeout) on the signal of the stream of the event's
        latest record: it is waited on while that record is its stream's last command (the
        signal is written when a stream drains). Returns as synchronize. Blocks."""
        record = self.records.get(event)
        slot = None if record is None else self.slots.get(record[0])
        if record is None or slot is None or timeout_ms < -1:
            return timeout_ms
        stream, seq = record
        stream_seq = self.connection.log.stream_seq
        outcome = self._wait(
            stream, slot, seq, _deadline(timeout_ms), lambda: stream_seq.get(stream) == seq
        )
        return self._outcome(outcome, timeout_ms)

    def synchronize_streams(self, streams: Iterable[int], timeout_ms: int) -> int | None:
        """aclrtSynchronizeDevice(WithTimeout) of a device whose streams are `streams`: each
        stream's signal at its last command and clean, and this process's latest call whose
        failure is reported later covered by a clean signal (no call is left to be
        rejected). Returns as synchronize. Blocks."""
        if timeout_ms < -1:
            return timeout_ms
        slots, log = self.slots, self.connection.log
        stream_seq, latest = log.stream_seq, log.deferred_seq
        waits = []
        for stream in streams:
            slot = slots.get(stream)
            if slot is None:
                return timeout_ms
            waits.append((stream, slot, stream_seq.get(stream, 0)))
        deadline = _deadline(timeout_ms)
        for stream, slot, seq in waits:
            outcome = self._wait(stream, slot, seq, deadline)
            if not outcome:
                return self._outcome(outcome, timeout_ms)
        if latest and all(seq != latest for _, _, seq in waits):  # a call elsewhere, after these
            if not any(self._covers(slot, latest) for slot in slots.values()):
                return timeout_ms
        self.decided += 1
        return None


def _deadline(timeout_ms: int) -> float | None:
    """The monotonic time a wait of `timeout_ms` ends (-1: never)."""
    return None if timeout_ms == -1 else time.monotonic() + timeout_ms / 1000


class FastPath:
    """The mapped segments of a session's fast path, in use by its connection."""

    def __init__(self, connection, notify_region: Region, ring_region: Region | None):
        self.connection = connection
        self.notify_region = notify_region
        self.ring_region = ring_region
        area = NotifyArea(notify_region.map)
        connection.use_notify(area)
        self.signals = StreamSignals(connection, area)
        if ring_region is not None:
            connection.use_ring(SubmissionRing(ring_region.map))

    def close(self) -> None:
        """Unmap (after the connection closed)."""
        if self.ring_region is not None:
            self.connection.ring.release()
            self.ring_region.close()
        self.connection.mailbox.area.release()
        self.notify_region.close()


def attach(connection, notify_name: str, ring_name: str) -> FastPath | None:
    """Map the session's notify area and submission ring and have `connection` use them
    (the caller made sure, with the staging probe, that this process shares the daemon's
    /dev/shm); None where futexes are not available or the daemon made none. Blocks."""
    notify_region = _map(notify_name)
    if notify_region is None:
        return None
    return FastPath(connection, notify_region, _map(ring_name, populate=True))


def _map(name: str, populate: bool = False) -> Region | None:
    if not name or not futex.AVAILABLE:
        return None
    try:
        return Region.attach(name, populate=populate)
    except Exception:
        return None
