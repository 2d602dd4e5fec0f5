"""Count notify tasks (aclrtCntNotifyRecord / Reset, aclrtCntNotifyWaitWithTimeout), run by
the scheduler itself when they reach the head of their stream (server/core/cnt_notifies.py).

A record changes the count and re-advances the streams waiting on it; a wait holds its
stream until its condition holds (clearing the count if asked). A wait whose timeout
passes first fails with ACL_ERROR_RT_WAIT_TIMEOUT (reported by the stream's next
synchronize) and its stream goes on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.core.cnt_notifies import recorded, satisfied
from simnpu.server.core.waiters import Waiter

from .base import Task, TaskState

if TYPE_CHECKING:
    from simnpu.server.core.cnt_notifies import CntNotify
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream


class CntNotifyRecordTask(Task):
    __slots__ = ("mode", "notify", "value")
    kind = "record_cnt_notify"

    def __init__(self, seq: int, stream: Stream, notify: CntNotify, mode: int, value: int):
        super().__init__(seq, stream)
        self.notify, self.mode, self.value = notify, mode, value

    def start(self, scheduler: Scheduler) -> bool:
        notify = self.notify
        notify.count = recorded(notify.count, self.mode, self.value)
        self.waiters.extend(notify.waiting)  # re-advanced when this completes
        notify.waiting.clear()
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "record count notify", "notify", {"mode": self.mode, "value": self.value}


class CntNotifyWaitTask(Task):
    __slots__ = ("clear", "mode", "notify", "timeout_s", "timer", "value")
    kind = "wait_cnt_notify"

    def __init__(
        self,
        seq: int,
        stream: Stream,
        notify: CntNotify,
        mode: int,
        value: int,
        timeout_s: int,
        clear: bool,
    ):
        super().__init__(seq, stream)
        self.notify, self.mode, self.value = notify, mode, value
        self.timeout_s = timeout_s  # 0: forever
        self.clear = clear
        self.timer: Waiter | None = None

    def start(self, scheduler: Scheduler) -> bool:
        notify, stream = self.notify, self.stream
        if satisfied(notify.count, self.mode, self.value):
            if self.clear:
                notify.count = 0
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
            return  # satisfied in time, or dropped
        self._forget()
        self.fail(
            codes.ACL_ERROR_RT_WAIT_TIMEOUT,
            f"aclrtCntNotifyWaitWithTimeout: the count notify's condition did not hold within "
            f"{self.timeout_s} s",
        )
        scheduler.complete(self)

    def _forget(self) -> None:
        if self.stream in self.notify.waiting:
            self.notify.waiting.remove(self.stream)

    def discarded(self, scheduler: Scheduler) -> None:
        self._forget()

    def describe(self) -> tuple[str, str, dict]:
        return "wait count notify", "notify", {"mode": self.mode, "value": self.value}
