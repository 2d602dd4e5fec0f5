"""Host callbacks and host functions (aclrtLaunchCallback, aclrtLaunchHostFunc; the task is
server/core/tasks/host_callback.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import commands
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.tasks import HostCallbackTask

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(commands.HostCallback)
def host_callback(session: Session, record: commands.HostCallback) -> None:
    stream = session.stream(record.stream)
    session.submit(HostCallbackTask(session.seq, stream, record.callback, record.blocking))


@handles(commands.HostDone)
def host_done(session: Session, record: commands.HostDone) -> None:
    """The client ran blocking callback `record.callback` (found by its id: the stream may
    be being destroyed, its handle already gone)."""
    owner, scheduler = session.owner, session.scheduler

    def returned() -> None:
        task = owner.waiting_callbacks.pop(record.callback, None)
        if task is not None:
            task.returned(scheduler)

    session.post(returned)
