"""What the tasks that hold their stream until something happens share, executed by the
scheduler itself when they reach the head of their stream.

A wait with a timeout of its own (aclrtStreamWaitEventWithTimeout, aclrtWaitAndResetNotify,
aclrtCntNotifyWaitWithTimeout; 0: forever) that passes before what it waits for happens
fails with ACL_ERROR_RT_WAIT_TIMEOUT, reported by the stream's next synchronize, and its
stream goes on (`TimedWait`). A notify or a count notify lists the streams whose head waits
on it; a record of it re-advances them (`NotifyRecord`, `NotifyWait`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from simnpu.proto import codes
from simnpu.server.core.waiters import Waiter

from .base import Task, TaskState

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream


class TimedWait(Task):
    """A task that holds its stream, failing once its own timeout (`timeout_s`) passes."""

    __slots__ = ("timeout_s", "timer")

    def __init__(self, seq: int, stream: Stream, timeout_s: int):
        super().__init__(seq, stream)
        self.timeout_s = timeout_s  # 0: forever
        self.timer: Waiter | None = None

    def _hold(self, scheduler: Scheduler) -> bool:
        """Its stream waits (False: it completes later); its timeout runs from the first
        time its stream reached it."""
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
            return  # what it waited for came in time, or it was dropped
        self._forget()
        self.fail(codes.ACL_ERROR_RT_WAIT_TIMEOUT, self.timed_out())
        scheduler.complete(self)

    def _forget(self) -> None:
        """It stops waiting: its timeout passed."""

    def timed_out(self) -> str:
        """The message of its failure when its timeout passed."""
        raise NotImplementedError


class Waitable(Protocol):
    """A notify or a count notify (server/core/notifies.py, server/core/cnt_notifies.py)."""

    waiting: list[Stream]  # the streams whose head waits on it


class NotifyRecord(Task):
    """A record of a notify: it changes the notify (`_record`) and re-advances the streams
    waiting on it."""

    __slots__ = ("notify",)
    notify: Waitable

    def start(self, scheduler: Scheduler) -> bool:
        notify = self.notify
        self._record()
        self.waiters.extend(notify.waiting)  # re-advanced when this completes
        notify.waiting.clear()
        return True

    def _record(self) -> None:
        raise NotImplementedError


class NotifyWait(TimedWait):
    """A wait on a notify: done at once if its condition holds (`_satisfied` takes it),
    else its stream is listed on the notify until a record re-advances it."""

    __slots__ = ("notify",)
    notify: Waitable

    def start(self, scheduler: Scheduler) -> bool:
        if self._satisfied():
            return True
        notify, stream = self.notify, self.stream
        if stream not in notify.waiting:
            notify.waiting.append(stream)
        return self._hold(scheduler)

    def _satisfied(self) -> bool:
        """Whether its condition holds now; if so it takes it (a notify's flag, a count to
        clear)."""
        raise NotImplementedError

    def _forget(self) -> None:
        if self.stream in self.notify.waiting:
            self.notify.waiting.remove(self.stream)

    def discarded(self, scheduler: Scheduler) -> None:
        self._forget()
