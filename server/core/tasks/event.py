"""Event tasks (aclrtRecordEvent, aclrtStreamWaitEvent, aclrtResetEvent), executed by the
scheduler itself when they reach the head of their stream.

A wait binds to the event's latest record at the time of the wait (ACL semantics), and
holds its stream until that record has completed; the stream's clock then moves to the
record's time, which is what aclrtEventElapsedTime measures. A wait on an event created
with ACL_EVENT_EXTERNAL (the runtime's event for task updates of captured graphs) binds when
its stream reaches it instead: to the event's record not undone by a reset, else to the
next record submitted. A wait with its own timeout
(aclrtStreamWaitEventWithTimeout) whose record has not completed when it passes fails with
ACL_ERROR_RT_WAIT_TIMEOUT, reported by the stream's next synchronize, and its stream goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes

from .base import Task, TaskState
from .wait import TimedWait

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Event, Stream


class RecordTask(Task):
    __slots__ = ("event",)
    kind = "record"

    def __init__(self, seq: int, stream: Stream, event: Event):
        super().__init__(seq, stream)
        self.event = event

    def submitted(self) -> None:
        event = self.event
        event.latest_record = self
        if event.waiting:  # external waits that found no record wait for this one
            self.waiters.extend(event.waiting)
            event.waiting.clear()

    def start(self, scheduler: Scheduler) -> bool:
        self.timestamp = self.stream.clock
        return True

    def describe(self) -> tuple[str, str, dict]:
        return f"record event {self.event.handle & 0xFFFFFFFF}", "event", {}


class WaitTask(TimedWait):
    __slots__ = ("event", "record")
    kind = "wait"

    def __init__(self, seq: int, stream: Stream, event: Event, timeout_s: int = 0):
        super().__init__(seq, stream, timeout_s)
        self.event = event
        self.record: RecordTask | None = None

    def submitted(self) -> None:
        record = self.record = self.event.latest_record
        if record is not None and record.stream.recorder is not None:
            record.stream.recorder.followed(self)  # a wait on a captured record: a fork

    def start(self, scheduler: Scheduler) -> bool:
        stream, event = self.stream, self.event
        if event.flags & codes.ACL_EVENT_EXTERNAL:  # binds when reached: to the record no
            self.record = event.latest_record  # reset undid, else the next one
            if self.record is None:
                if stream not in event.waiting:
                    event.waiting.append(stream)
                return False
        record = self.record
        if record is None:
            return True
        if record.state != TaskState.DONE:
            if stream not in record.waiters:
                record.waiters.append(stream)  # re-advanced when the record completes
            return self._hold(scheduler)
        stream.clock = max(stream.clock, record.timestamp)
        return True

    def timed_out(self) -> str:
        return (
            f"aclrtStreamWaitEventWithTimeout: the event was not recorded-complete within "
            f"{self.timeout_s} s"
        )

    def follows(self) -> Task | None:
        return self.record

    def describe(self) -> tuple[str, str, dict]:
        if self.record is None:
            return "wait event (never recorded)", "event", {}
        return (
            f"wait event (record task {self.record.seq})",
            "event",
            {"record_task": self.record.seq, "record_stream": self.record.stream.handle},
        )


class ResetTask(Task):
    __slots__ = ("event",)
    kind = "reset"

    def __init__(self, seq: int, stream: Stream, event: Event):
        super().__init__(seq, stream)
        self.event = event

    def start(self, scheduler: Scheduler) -> bool:
        latest = self.event.latest_record
        if latest is not None and latest.state == TaskState.DONE:
            self.event.latest_record = None
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "reset event", "event", {}
