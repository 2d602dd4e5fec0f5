"""Value tasks (aclrtValueWrite, aclrtValueWait): stream-ordered writes and waits on a
64-bit word of device memory, run by the scheduler itself (it maps every device's memory)
when they reach the head of their stream.

A wait whose condition does not hold does not poll: its stream is re-advanced (and the
word read again) whenever any task completes -- value writes, copies, memsets, kernels,
whatever could have written the word -- and, for writes no task makes (a synchronous copy
the session's own thread runs, another process writing a word it imported), by a timer
every RECHECK_S while it waits. A wait has no timeout of its own (aclrtValueWait has none).
"""

from __future__ import annotations

import struct
import time
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.core.waiters import Waiter

from .base import Task, TaskState

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.unit_protocol import Span

WORD = struct.Struct("<Q")
MASK = (1 << 64) - 1
RECHECK_S = 0.02
"""How often a waiting aclrtValueWait reads its word again when no task completed: one read
per waiting stream per period, whatever the load."""


def holds(word: int, flag: int, value: int) -> bool:
    """Whether aclrtValueWait's condition `flag` holds for `word` (the real header's rules)."""
    if flag == codes.ACL_STREAM_WAIT_VALUE_GEQ:
        return (word - value) & MASK < 1 << 63  # (int64_t)(*devAddr - value) >= 0
    if flag == codes.ACL_STREAM_WAIT_VALUE_EQ:
        return word == value
    if flag == codes.ACL_STREAM_WAIT_VALUE_AND:
        return word & value != 0
    return ~(word | value) & MASK != 0  # ACL_STREAM_WAIT_VALUE_NOR


class ValueWriteTask(Task):
    __slots__ = ("span", "value")
    kind = "value_write"

    def __init__(self, seq: int, stream: Stream, span: Span, value: int):
        super().__init__(seq, stream)
        self.span, self.value = span, value

    def start(self, scheduler: Scheduler) -> bool:
        WORD.pack_into(scheduler.devices[self.span.device].region.map, self.span.offset, self.value)
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "value write", "memory", {"value": self.value}


class ValueWaitTask(Task):
    __slots__ = ("flag", "span", "timer", "value")
    kind = "value_wait"

    def __init__(self, seq: int, stream: Stream, span: Span, value: int, flag: int):
        super().__init__(seq, stream)
        self.span, self.value, self.flag = span, value, flag
        self.timer: Waiter | None = None

    def start(self, scheduler: Scheduler) -> bool:
        span = self.span
        (word,) = WORD.unpack_from(scheduler.devices[span.device].region.map, span.offset)
        if holds(word, self.flag, self.value):
            return True
        scheduler.recheck_at_completions(self.stream)
        if self.timer is None:
            self.timer = Waiter(
                lambda: False, lambda timed_out: self._tick(scheduler), time.monotonic() + RECHECK_S
            )
            scheduler.watch(self.timer)
        return False

    def _tick(self, scheduler: Scheduler) -> None:
        self.timer = None
        tasks = self.stream.tasks
        if self.state == TaskState.PENDING and tasks and tasks[0] is self:
            scheduler.recheck(self.stream)

    def describe(self) -> tuple[str, str, dict]:
        return "value wait", "memory", {"value": self.value, "flag": self.flag}
