"""aclrtSynchronizeStream without a request, when the stream's word in the notify area
proves the outcome (docs/fast-path.md).

The word holds the sequence number of the stream's last completed task, with DIRTY set
when a synchronize would report a failure. If the stream's last command is this process's
latest call whose failure is reported later, a clean word at or past it means "done, and
nothing to report"; a dirty one means the daemon must be asked.
"""

from __future__ import annotations

import time

from simnpu.shm.notify import DIRTY, SEQ_MASK

_SLICE_S = 0.1  # how often a sleeping synchronize re-checks that the session is alive


class StreamWords:
    """The stream words of one session's notify area, as the client sees them."""

    def __init__(self, connection, area):
        self.connection = connection
        self.area = area
        self.slots: dict[int, int] = {}  # stream handle -> its word
        self.decided = 0  # synchronizes decided here, without a request (a statistic)

    def add(self, stream: int, slot: int) -> None:
        if slot >= 0:
            self.slots[stream] = slot

    def remove(self, stream: int) -> None:
        self.slots.pop(stream, None)
        self.connection.stream_seq.pop(stream, None)

    def synchronize(self, stream: int, timeout_ms: int) -> int | None:
        """Wait for `stream` on its word if that can decide the synchronize: None when it
        did (success). Otherwise the timeout (ms) the daemon should be asked with: 0 when
        this wait already used up `timeout_ms`. Blocks."""
        slot = self.slots.get(stream)
        connection = self.connection
        target = connection.stream_seq.get(stream)
        if slot is None or target is None or target != connection.deferred_seq or timeout_ms < -1:
            return timeout_ms
        area = self.area
        deadline = None if timeout_ms == -1 else time.monotonic() + timeout_ms / 1000
        connection.ring_doorbell()  # the daemon must not wait for the sender thread now
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
