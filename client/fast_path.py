"""The client's end of a session's fast path (docs/fast-path.md): mapping its notify area
and submission ring, and aclrtSynchronizeStream decided on a stream's completion signal.

A stream's signal holds the sequence number of the stream's last completed task, with DIRTY
set when a synchronize would report a failure (shm/notify.py's StreamSignal). If the
stream's last command is this process's latest call whose failure is reported later, a
clean signal at or past it means "done, and nothing to report"; a dirty one means the daemon
must be asked.
"""

from __future__ import annotations

import time

from simnpu.shm import futex
from simnpu.shm.notify import DIRTY, SEQ_MASK, NotifyArea
from simnpu.shm.region import Region
from simnpu.shm.ring import SubmissionRing

_SLICE_S = 0.1  # how often a sleeping synchronize re-checks that the session is alive


class StreamSignals:
    """The completion signals of one session's streams, as the client sees them."""

    def __init__(self, connection, area):
        self.connection = connection
        self.area = area
        self.slots: dict[int, int] = {}  # stream handle -> its signal's slot
        self.decided = 0  # synchronizes decided here, without a request (a statistic)

    def add(self, stream: int, slot: int) -> None:
        self.slots[stream] = slot

    def remove(self, stream: int) -> None:
        self.slots.pop(stream, None)
        self.connection.log.stream_seq.pop(stream, None)

    def synchronize(self, stream: int, timeout_ms: int) -> int | None:
        """Wait for `stream` on its signal if that can decide the synchronize: None when it
        did (success). Otherwise the timeout (ms) the daemon should be asked with: 0 when
        this wait already used up `timeout_ms`. Blocks."""
        slot = self.slots.get(stream)
        connection = self.connection
        target = connection.log.stream_seq.get(stream)
        if (
            slot is None
            or target is None
            or target != connection.log.deferred_seq
            or timeout_ms < -1
        ):
            return timeout_ms
        area = self.area
        deadline = None if timeout_ms == -1 else time.monotonic() + timeout_ms / 1000
        connection.ring_doorbell()  # a wake-up of the daemon the launch missed
        while True:
            word = area.word(slot)
            if word & SEQ_MASK >= target:
                if word & DIRTY:
                    return timeout_ms
                self.decided += 1
                return None
            if connection.broken is not None:
                return timeout_ms  # the request raises the session's error
            slice_s = _SLICE_S
            if deadline is not None:
                slice_s = min(slice_s, deadline - time.monotonic())
                if slice_s <= 0:
                    return 0
            area.wait_word(slot, word, slice_s)


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
