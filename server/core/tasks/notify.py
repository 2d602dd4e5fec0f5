"""Notify tasks (aclrtRecordNotify, aclrtWaitAndResetNotify), executed by the scheduler
itself when they reach the head of their stream (server/core/notifies.py).

A record sets the notify's flag and wakes the streams waiting for it; a wait holds its
stream until the flag is set, then clears it. A wait with a timeout that passes first fails
with ACL_ERROR_RT_WAIT_TIMEOUT (reported by the stream's next synchronize) and its stream
goes on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.core.waiters import Waiter

from .base import Task, TaskState

if TYPE_CHECKING:
    from simnpu.server.core.notifies import Notify
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream


class NotifyRecordTask(Task):
    __slots__ = ("notify",)
    kind = "record_notify"

    def __init__(self, seq: int, stream: Stream, notify: Notify):
        super().__init__(seq, stream)
        self.notify = notify

    def start(self, scheduler: Scheduler) -> bool:
        notify = self.notify
        notify.is_set = True
        self.waiters.extend(notify.waiting)  # re-advanced when this completes
        notify.waiting.clear()
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "record notify", "notify", {}


class NotifyWaitTask(Task):
    __slots__ = ("notify", "timeout_s", "timer")
    kind = "wait_notify"

    def __init__(self, seq: int, stream: Stream, notify: Notify, timeout_s: int):
        super().__init__(seq, stream)
        self.notify = notify
        self.timeout_s = timeout_s  # 0: forever
        self.timer: Waiter | None = None

    def start(self, scheduler: Scheduler) -> bool:
        notify, stream = self.notify, self.stream
        if notify.is_set:
            notify.is_set = False
            return True
        if stream not in notify.waiting:
            notify.waiting.append(stream)
        if self.timeout_s and self.timer is None:
            self.timer = Waiter(
                lambda: False,
                lambda timed_out: self._expired(scheduler),
                time.monotonic() + self.timeout_s,
            )
            scheduler.watch(self.timer)
        return False

    def _expired(self, scheduler: Scheduler) -> None:
        tasks = self.stream.tasks
        if self.state != TaskState.PENDING or not tasks or tasks[0] is not self:
            return  # it was set in time, or dropped
        self._forget()
        self.fail(
            codes.ACL_ERROR_RT_WAIT_TIMEOUT,
            f"aclrtWaitAndResetNotify: the notify was not recorded within {self.timeout_s} s",
        )
        scheduler.complete(self)

    def _forget(self) -> None:
        if self.stream in self.notify.waiting:
            self.notify.waiting.remove(self.stream)

    def discarded(self, scheduler: Scheduler) -> None:
        self._forget()

    def describe(self) -> tuple[str, str, dict]:
        return "wait and reset notify", "notify", {}
