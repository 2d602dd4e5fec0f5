"""A session's notify area: replies and the streams' completion signals, through shared memory.

Layout and protocol are described in docs/fast-path.md. This module knows the layout, the
futex calls and the signals' one-writer rule (`StreamSignal`); it works over any writable
buffer (a mapped Region, or a plain mmap in tests). The daemon and its workers write; the
client reads and sleeps.

Words are read and written through ctypes views (one aligned 8- or 4-byte load or store
each), never through struct, whose little-endian codes move bytes one at a time.
"""

from __future__ import annotations

import ctypes

from simnpu.shm import futex

MAILBOX_SLOTS = 16
SLOT_BYTES = 4096
SLOT_HEADER = 16  # u64 request id, u32 length, u32 unused
SLOT_CAPACITY = SLOT_BYTES - SLOT_HEADER
STREAM_SLOTS = 4096
OVERFLOW = 0xFFFFFFFF  # length of a reply too big for a slot: it went by the stream
DIRTY = 1 << 63  # in a stream word: a failure is waiting to be reported

_DOORBELL = 0
_MAILBOX = 64
_STREAMS = _MAILBOX + MAILBOX_SLOTS * SLOT_BYTES
SIZE = _STREAMS + 8 * STREAM_SLOTS
SEQ_MASK = DIRTY - 1


class NotifyArea:
    """The notify area laid over `buffer` (SIZE bytes or more, writable); `name`: its
    segment's, for the daemon's side (units write signals into it by name)."""

    def __init__(self, buffer, name: str = ""):
        self.buffer = buffer
        self.name = name
        self._free = list(range(STREAM_SLOTS - 1, -1, -1))  # the daemon's: signal slots not in use
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        self._doorbell = ctypes.c_uint32.from_buffer(buffer, _DOORBELL)
        self._words = (ctypes.c_uint64 * STREAM_SLOTS).from_buffer(buffer, _STREAMS)
        self._ids = [ctypes.c_uint64.from_buffer(buffer, _slot(i)) for i in range(MAILBOX_SLOTS)]
        self._lengths = [
            ctypes.c_uint32.from_buffer(buffer, _slot(i) + 8) for i in range(MAILBOX_SLOTS)
        ]

    def release(self) -> None:
        """Drop the views into the buffer, so that its mapping can be closed."""
        del self._doorbell, self._words  # nothing of the area is used after this
        self._ids, self._lengths = [], []

    def new_signal(self) -> StreamSignal | None:
        """A new stream's completion signal (the daemon); None when every slot is taken."""
        return StreamSignal(self, self._free.pop()) if self._free else None

    def release_signal(self, signal: StreamSignal) -> None:
        """The stream is gone and nothing of it runs any more: its slot may be reused."""
        self._free.append(signal.slot)

    # ---- the daemon and its workers ------------------------------------------------------
    def post_reply(self, slot: int, request_id: int, payload: bytes) -> bool:
        """Put a serialized Reply in mailbox `slot` and wake the client; False if it does
        not fit (the slot then says OVERFLOW: the reply must go by the stream). The caller
        serializes calls for one area."""
        fits = len(payload) <= SLOT_CAPACITY
        if fits:
            start = _slot(slot) + SLOT_HEADER
            self.buffer[start : start + len(payload)] = payload
        self._lengths[slot].value = len(payload) if fits else OVERFLOW
        self._ids[slot].value = request_id  # last: the client looks for it
        self._doorbell.value = (self._doorbell.value + 1) & 0xFFFFFFFF
        futex.wake(self._base + _DOORBELL)
        return fits

    def set_done(self, slot: int, seq: int, dirty: bool, wake: bool = True) -> None:
        """Stream word `slot` says its tasks up to `seq` completed; wake its waiters (else
        the caller does, with wake_stream)."""
        self._words[slot] = seq | DIRTY if dirty else seq
        if wake:
            futex.wake(self._base + _STREAMS + 8 * slot)

    def wake_stream(self, slot: int) -> None:
        """Wake the waiters of stream word `slot` (written with set_done without `wake`)."""
        futex.wake(self._base + _STREAMS + 8 * slot)

    # ---- the client ------------------------------------------------------------------------
    def doorbell(self) -> int:
        return self._doorbell.value

    def take_reply(self, slot: int, request_id: int):
        """The payload in mailbox `slot` if it holds the reply to `request_id`, OVERFLOW if
        that reply went by the stream, else None (not there yet)."""
        if self._ids[slot].value != request_id:
            return None
        length = self._lengths[slot].value
        if length == OVERFLOW:
            return OVERFLOW
        start = _slot(slot) + SLOT_HEADER
        return bytes(self.buffer[start : start + min(length, SLOT_CAPACITY)])

    def wake_doorbell(self) -> None:
        """Wake the doorbell's sleepers without ringing it (they re-check their own state)."""
        futex.wake(self._base + _DOORBELL)

    def wait_doorbell(self, seen: int, timeout_s: float) -> None:
        """Sleep until the doorbell moves past `seen` (or `timeout_s` passes). Blocks."""
        futex.wait(self._base + _DOORBELL, seen, timeout_s)

    def word(self, slot: int) -> int:
        """Stream word `slot`: the last completed sequence number, DIRTY or'ed in."""
        return self._words[slot]

    def wait_word(self, slot: int, seen: int, timeout_s: float) -> None:
        """Sleep until stream word `slot` changes from `seen` (or `timeout_s` passes). Blocks."""
        futex.wait(self._base + _STREAMS + 8 * slot, seen, timeout_s)


def _slot(index: int) -> int:
    return _MAILBOX + index * SLOT_BYTES


class StreamSignal:
    """One stream's completion signal, the daemon's side: a monotonic value in the notify
    area -- the sequence number of the stream's last completed task, DIRTY when a
    synchronize would report a failure -- that clients wait on (word, wait_word).

    One writer at a time. The daemon's scheduler writes it, unless it has lent it to the
    unit that runs the stream's tail (`lend`), which writes it the moment its batch
    succeeded, one process wake-up sooner. While it is lent, what the scheduler would write
    is kept (`publish`) and written when the unit's report comes back (`take_back`): the
    value never goes down, and no reader has to reconcile two writers.
    """

    __slots__ = ("_pending", "area", "lent", "slot", "value")

    def __init__(self, area: NotifyArea, slot: int):
        self.area = area
        self.slot = slot
        self.value = 0  # the highest sequence number published
        self.lent = False  # a unit writes it after its batch
        self._pending: tuple[int, bool] | None = None  # what to write once it comes back

    def publish(self, seq: int, dirty: bool) -> None:
        """The stream ran (or dropped) everything up to `seq`; `dirty`: a failure waits to be
        reported. Never below what was published before."""
        seq = self.value = max(self.value, seq)
        if self.lent:
            self._pending = (seq, dirty)
            return
        if self.area.word(self.slot) != (
            seq | DIRTY if dirty else seq
        ):  # (a unit wrote it already)
            self.area.set_done(self.slot, seq, dirty)

    def lend(self) -> None:
        """A unit writes the signal after its batch (clean, up to the batch's last task)."""
        self.lent = True

    def take_back(self) -> None:
        """The unit reported its batch: the scheduler writes the signal again."""
        self.lent = False
        if self._pending is not None:
            (seq, dirty), self._pending = self._pending, None
            self.publish(seq, dirty)

    def covers(self, seq: int) -> bool:
        """Does the signal say, clean, that every task up to `seq` has run? (a unit may have
        written it before the scheduler took its report)"""
        word = self.area.word(self.slot)
        return not word & DIRTY and word >= seq
