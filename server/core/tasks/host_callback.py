"""A host callback or host function (aclrtLaunchCallback, aclrtLaunchHostFunc): when its
stream reaches it, the client is told to run it; a blocking one holds the stream until the
client says it has returned (commands.HostDone)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .base import Task, TaskState

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream


class HostCallbackTask(Task):
    __slots__ = ("blocking", "callback")
    kind = "host"
    moves_clock = True

    def __init__(self, seq: int, stream: Stream, callback: int, blocking: bool):
        super().__init__(seq, stream)
        self.callback = callback  # the id the client gave it
        self.blocking = blocking

    def start(self, scheduler: Scheduler) -> bool:
        owner = self.stream.owner
        if self.blocking:
            self.state = TaskState.DISPATCHED
            owner.waiting_callbacks[self.callback] = self
        owner.announce(self.callback)
        return not self.blocking

    def returned(self, scheduler: Scheduler) -> None:
        """The client ran the blocking callback (or is gone): the stream goes on."""
        if self.state == TaskState.DISPATCHED:
            self.timestamp = time.monotonic_ns()
            scheduler.complete(self)

    def describe(self) -> tuple[str, str, dict]:
        return "host callback (blocking)" if self.blocking else "host callback", "host", {}
