"""A session's submission ring: the client's commands and requests to the daemon through
shared memory (docs/fast-path.md), one producer (the client, its calls serialized by its
connection lock) and one consumer (the daemon's ring thread).

Records are what travels in a ClientMessage's `commands` bytes (simnpu.proto.commands),
written back to back; `head` and `tail` count bytes written and consumed since the start
(they never wrap; a position in the data is the count modulo CAPACITY). A record never
straddles the end of the data: the producer writes RING_END there (or leaves fewer
than 2 bytes) and goes on at the start. Both sides sleep on futexes: the daemon on `head`
when the ring is empty, the client on `tail` when it is full. The daemon counts its naps in
`sleeping` (odd while it naps), so the client wakes it once per nap, not once per record
put while it has not run yet. Words are read and written
through ctypes views (single aligned loads and stores).
"""

from __future__ import annotations

import ctypes

from simnpu.proto.commands import RING_END
from simnpu.shm import futex

CAPACITY = 4 << 20
MAX_RECORD = CAPACITY // 8  # bigger requests go by the gRPC stream instead
_HEAD, _TAIL, _SLEEPING, _WAITING = 0, 64, 128, 192  # one cache line each
_DATA = 256
SIZE = _DATA + CAPACITY
_END = RING_END
_WAIT_SLICE_S = 0.01


class RingCorrupt(Exception):
    """The counters in the ring make no sense: its writer broke the protocol."""


class RingClosed(Exception):
    """The ring is full and its reader is gone."""


class SubmissionRing:
    """The ring laid over `buffer` (SIZE bytes or more, writable). `reader_gone()` tells a
    client waiting for room that it never will get any."""

    def __init__(self, buffer, reader_gone=lambda: False):
        self.buffer = buffer
        self.reader_gone = reader_gone
        base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        self._head_address, self._tail_address = base + _HEAD, base + _TAIL
        self._head = ctypes.c_uint64.from_buffer(buffer, _HEAD)
        self._tail = ctypes.c_uint64.from_buffer(buffer, _TAIL)
        self._sleeping = ctypes.c_uint32.from_buffer(buffer, _SLEEPING)
        self._waiting = ctypes.c_uint32.from_buffer(buffer, _WAITING)
        self._consumed = 0  # the daemon's own tail: what the client writes is never trusted
        self._written = 0  # the client's own head
        self._woken = 0  # the client's: the daemon's nap (an odd count) it last woke
        self._room_until = CAPACITY  # the client may write up to here without reading tail

    def release(self) -> None:
        """Drop the views into the buffer, so that its mapping can be closed."""
        del self._head, self._tail, self._sleeping, self._waiting  # nothing uses them after

    @property
    def written(self) -> int:
        """Bytes written since the ring was made (a statistic)."""
        return self._written

    # ---- the client ------------------------------------------------------------------------
    def put(self, record: bytes, wake: bool = True) -> None:
        """Append one record (2 .. MAX_RECORD bytes); with `wake`, wake the daemon if it
        sleeps (else the caller sees to it: another record put with `wake`, or
        wake_reader). Blocks while the ring is full; raises RingClosed if its reader is
        gone meanwhile."""
        size = len(record)
        head = self._written
        position = head % CAPACITY
        skip = CAPACITY - position if position + size > CAPACITY else 0
        end = head + skip + size
        if end > self._room_until:  # what the daemon took since we last looked frees room
            self._room_until = self._tail.value + CAPACITY
            if end > self._room_until:
                self._wait_for_room(end)
        if skip:
            if skip >= 2:
                self.buffer[_DATA + position : _DATA + position + 2] = _END
            position = 0
        self.buffer[_DATA + position : _DATA + position + size] = record
        self._written = self._head.value = end
        if wake:
            nap = self._sleeping.value
            if nap & 1 and nap != self._woken:
                self._woken = nap
                futex.wake(self._head_address)

    def wake_reader(self) -> None:
        """Wake the daemon if it naps although it has not taken everything written (a
        wake-up `put` missed, see docs/fast-path.md, or records put without `wake`) and
        nobody woke it from this nap yet."""
        nap = self._sleeping.value
        if nap & 1 and nap != self._woken and self._tail.value != self._written:
            self._woken = nap
            futex.wake(self._head_address)

    def _wait_for_room(self, end: int) -> None:
        """Sleep until the daemon has taken enough for the ring to hold up to `end`."""
        while True:
            self._waiting.value = 1
            tail = self._tail.value
            if tail + CAPACITY >= end:
                break
            if self.reader_gone():
                raise RingClosed("the daemon no longer reads this session's submission ring")
            futex.wait(self._tail_address, tail, _WAIT_SLICE_S)
        self._waiting.value = 0
        self._room_until = tail + CAPACITY

    # ---- the daemon ------------------------------------------------------------------------
    def take(self) -> list[bytes]:
        """Copy out everything written since the last take (one or two pieces: before and
        after the end of the data) and free its room. Raises RingCorrupt."""
        head, tail = self._head.value, self._consumed
        if head == tail:
            return []
        if not 0 < head - tail <= CAPACITY:
            raise RingCorrupt(f"head {head} and tail {tail} are {head - tail} bytes apart")
        start = tail % CAPACITY
        if head // CAPACITY == tail // CAPACITY:
            pieces = [self.buffer[_DATA + start : _DATA + head % CAPACITY]]
        else:  # the first piece ends at RING_END or the end of the data
            pieces = [
                self.buffer[_DATA + start : _DATA + CAPACITY],
                self.buffer[_DATA : _DATA + head % CAPACITY],
            ]
        self._consumed = self._tail.value = head
        if self._waiting.value:
            futex.wake(self._tail_address)
        return pieces

    def sleep(self, timeout_s: float) -> None:
        """Sleep until the client writes (or `timeout_s` passes). Blocks."""
        seen = self._head.value
        if seen != self._consumed:
            return
        nap = self._sleeping.value | 1  # odd: napping (a client may have scribbled on it)
        self._sleeping.value = nap
        if self._head.value == seen:
            futex.wait(self._head_address, seen, timeout_s)
        self._sleeping.value = nap + 1

    def wake_consumer(self) -> None:
        """Wake the daemon's ring thread without writing (it re-checks whether to stop)."""
        futex.wake(self._head_address)
