"""Notify tasks (aclrtRecordNotify, aclrtWaitAndResetNotify), executed by the scheduler
itself when they reach the head of their stream (server/core/notifies.py).

A record sets the notify's flag and wakes the streams waiting for it; a wait holds its
stream until the flag is set, then clears it. A wait with a timeout that passes first fails
with ACL_ERROR_RT_WAIT_TIMEOUT (reported by the stream's next synchronize) and its stream
goes on (server/core/tasks/wait.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .wait import NotifyRecord, NotifyWait

if TYPE_CHECKING:
    from simnpu.server.core.notifies import Notify
    from simnpu.server.core.streams import Stream


class NotifyRecordTask(NotifyRecord):
    __slots__ = ()
    kind = "record_notify"
    notify: Notify

    def __init__(self, seq: int, stream: Stream, notify: Notify):
        super().__init__(seq, stream)
        self.notify = notify

    def _record(self) -> None:
        self.notify.is_set = True

    def describe(self) -> tuple[str, str, dict]:
        return "record notify", "notify", {}


class NotifyWaitTask(NotifyWait):
    __slots__ = ()
    kind = "wait_notify"
    notify: Notify

    def __init__(self, seq: int, stream: Stream, notify: Notify, timeout_s: int):
        super().__init__(seq, stream, timeout_s)
        self.notify = notify

    def _satisfied(self) -> bool:
        notify = self.notify
        if not notify.is_set:
            return False
        notify.is_set = False
        return True

    def timed_out(self) -> str:
        return f"aclrtWaitAndResetNotify: the notify was not recorded within {self.timeout_s} s"

    def describe(self) -> tuple[str, str, dict]:
        return "wait and reset notify", "notify", {}
