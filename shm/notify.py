"""A session's notify area: replies and stream completions through shared memory.

Layout and protocol are described in docs/fast-path.md. This module only knows the layout
and the futex calls; it works over any writable buffer (a mapped Region, or a plain mmap
in tests). The daemon and its workers write; the client reads and sleeps.

Words are read and written through ctypes views (one aligned 8- or 4-byte load or store
each), never through struct, whose little-endian codes move bytes one at a time.
"""

from __future__ import annotations

import ctypes

from simnpu.shm import futex

MAILBOX_SLOTS = 16
SLOT_BYTES = 4096
SLOT_HEADER = 16                 # u64 request id, u32 length, u32 unused
SLOT_CAPACITY = SLOT_BYTES - SLOT_HEADER
STREAM_SLOTS = 4096
OVERFLOW = 0xFFFFFFFF            # length of a reply too big for a slot: it went by the stream
DIRTY = 1 << 63                  # in a stream word: a failure is waiting to be reported

_DOORBELL = 0
_MAILBOX = 64
_STREAMS = _MAILBOX + MAILBOX_SLOTS * SLOT_BYTES
SIZE = _STREAMS + 8 * STREAM_SLOTS
SEQ_MASK = DIRTY - 1


class NotifyArea:
    """The notify area laid over `buffer` (SIZE bytes or more, writable)."""

    def __init__(self, buffer):
        self.buffer = buffer
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        self._doorbell = ctypes.c_uint32.from_buffer(buffer, _DOORBELL)
        self._words = (ctypes.c_uint64 * STREAM_SLOTS).from_buffer(buffer, _STREAMS)
        self._ids = [ctypes.c_uint64.from_buffer(buffer, _slot(i)) for i in range(MAILBOX_SLOTS)]
        self._lengths = [ctypes.c_uint32.from_buffer(buffer, _slot(i) + 8) for i in range(MAILBOX_SLOTS)]

    def release(self) -> None:
        """Drop the views into the buffer, so that its mapping can be closed."""
        self._doorbell = self._words = None
        self._ids = self._lengths = []

    # ---- the daemon and its workers ------------------------------------------------------
    def post_reply(self, slot: int, request_id: int, payload: bytes) -> bool:
        """Put a serialized Reply in mailbox `slot` and wake the client; False if it does
        not fit (the slot then says OVERFLOW: the reply must go by the stream). The caller
        serializes calls for one area."""
        fits = len(payload) <= SLOT_CAPACITY
        if fits:
            start = _slot(slot) + SLOT_HEADER
            self.buffer[start:start + len(payload)] = payload
        self._lengths[slot].value = len(payload) if fits else OVERFLOW
        self._ids[slot].value = request_id  # last: the client looks for it
        self._doorbell.value = (self._doorbell.value + 1) & 0xFFFFFFFF
        futex.wake(self._base + _DOORBELL)
        return fits

    def set_done(self, slot: int, seq: int, dirty: bool) -> None:
        """Stream word `slot` says its tasks up to `seq` completed; wake its waiters."""
        self._words[slot] = seq | DIRTY if dirty else seq
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
        return bytes(self.buffer[start:start + min(length, SLOT_CAPACITY)])

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
