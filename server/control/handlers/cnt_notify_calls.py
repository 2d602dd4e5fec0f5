"""Count notifies: create, destroy, and the record / reset / wait commands that queue their
tasks (server/core/cnt_notifies.py, server/core/tasks/cnt_notify.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import commands
from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.cnt_notifies import CntNotify
from simnpu.server.core.tasks import CntNotifyRecordTask, CntNotifyWaitTask

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


def _cnt_notify(session: Session, handle: int) -> CntNotify:
    return session.handles.get(handle, CntNotify, "count notify")


@handles(pb.CntNotifyCreateRequest)
def create(
    session: Session, request: pb.CntNotifyCreateRequest, reply_to: int
) -> pb.CntNotifyCreateReply:
    """aclrtCntNotifyCreate on the context's device; 207009 past the device's count notifies."""
    context = session.context(request.context)
    notify = session.daemon.cnt_notifies.create(session.owner.id, context.device, request.flags)
    handle = session.handles.add(notify, HandleKind.CNT_NOTIFY)
    return pb.CntNotifyCreateReply(cnt_notify=handle, id=notify.id)


@handles(pb.CntNotifyDestroyRequest)
def destroy(session: Session, request: pb.CntNotifyDestroyRequest, reply_to: int) -> None:
    """aclrtCntNotifyDestroy: queued records and waits keep the object until they ran."""
    notify = _cnt_notify(session, request.cnt_notify)
    session.handles.remove(request.cnt_notify)
    session.daemon.cnt_notifies.release(notify)


@handles(commands.CntNotifyRecord)
def record(session: Session, command: commands.CntNotifyRecord) -> None:
    """aclrtCntNotifyRecord / aclrtCntNotifyReset (async)."""
    notify, stream = _cnt_notify(session, command.notify), session.stream(command.stream)
    commands.check_cnt_notify(True, command.mode, command.value)
    session.submit(CntNotifyRecordTask(session.seq, stream, notify, command.mode, command.value))


@handles(commands.CntNotifyWait)
def wait(session: Session, command: commands.CntNotifyWait) -> None:
    """aclrtCntNotifyWaitWithTimeout (async)."""
    notify, stream = _cnt_notify(session, command.notify), session.stream(command.stream)
    commands.check_cnt_notify(False, command.mode, command.value)
    session.submit(
        CntNotifyWaitTask(
            session.seq,
            stream,
            notify,
            command.mode,
            command.value,
            command.timeout,
            bool(command.clear),
        )
    )
