"""Count notify tasks (aclrtCntNotifyRecord / Reset, aclrtCntNotifyWaitWithTimeout), run by
the scheduler itself when they reach the head of their stream (server/core/cnt_notifies.py).

A record changes the count and re-advances the streams waiting on it; a wait holds its
stream until its condition holds (clearing the count if asked). A wait whose timeout
passes first fails with ACL_ERROR_RT_WAIT_TIMEOUT (reported by the stream's next
synchronize) and its stream goes on (server/core/tasks/wait.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.server.core.cnt_notifies import recorded, satisfied

from .wait import NotifyRecord, NotifyWait

if TYPE_CHECKING:
    from simnpu.server.core.cnt_notifies import CntNotify
    from simnpu.server.core.streams import Stream


class CntNotifyRecordTask(NotifyRecord):
    __slots__ = ("mode", "value")
    kind = "record_cnt_notify"
    notify: CntNotify

    def __init__(self, seq: int, stream: Stream, notify: CntNotify, mode: int, value: int):
        super().__init__(seq, stream)
        self.notify, self.mode, self.value = notify, mode, value

    def _record(self) -> None:
        notify = self.notify
        notify.count = recorded(notify.count, self.mode, self.value)

    def describe(self) -> tuple[str, str, dict]:
        return "record count notify", "notify", {"mode": self.mode, "value": self.value}


class CntNotifyWaitTask(NotifyWait):
    __slots__ = ("clear", "mode", "value")
    kind = "wait_cnt_notify"
    notify: CntNotify

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
        super().__init__(seq, stream, timeout_s)
        self.notify, self.mode, self.value = notify, mode, value
        self.clear = clear

    def _satisfied(self) -> bool:
        notify = self.notify
        if not satisfied(notify.count, self.mode, self.value):
            return False
        if self.clear:
            notify.count = 0
        return True

    def timed_out(self) -> str:
        return (
            f"aclrtCntNotifyWaitWithTimeout: the count notify's condition did not hold within "
            f"{self.timeout_s} s"
        )

    def describe(self) -> tuple[str, str, dict]:
        return "wait count notify", "notify", {"mode": self.mode, "value": self.value}
