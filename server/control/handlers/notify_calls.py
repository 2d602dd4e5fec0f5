"""Notifies: create, destroy, export, whitelist, import, and the record / wait commands that
queue their tasks (server/core/notifies.py, server/core/tasks/notify.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import commands
from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.notifies import Notify
from simnpu.server.core.tasks import NotifyRecordTask, NotifyWaitTask
from simnpu.server.core.untrusted import IPC_KEY, check_length

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


def _notify(session: Session, handle: int) -> Notify:
    return session.handles.get(handle, Notify, "notify")


@handles(pb.CreateNotifyRequest)
def create_notify(
    session: Session, request: pb.CreateNotifyRequest, reply_to: int
) -> pb.CreateNotifyReply:
    """aclrtCreateNotify on the context's device; 207009 past the device's notifies."""
    context = session.context(request.context)
    notify = session.daemon.notifies.create(session.owner, context.device, request.flags)
    return pb.CreateNotifyReply(notify=session.handles.add(notify, HandleKind.NOTIFY))


@handles(pb.DestroyNotifyRequest)
def destroy_notify(session: Session, request: pb.DestroyNotifyRequest, reply_to: int) -> None:
    """aclrtDestroyNotify: this client's handle goes; the notify when its last holder's does."""
    notify = _notify(session, request.notify)
    session.handles.remove(request.notify)
    session.daemon.notifies.release(notify)


@handles(pb.NotifyExportRequest)
def export(
    session: Session, request: pb.NotifyExportRequest, reply_to: int
) -> pb.NotifyExportReply:
    notify = _notify(session, request.notify)
    return pb.NotifyExportReply(
        key=session.daemon.notifies.export(session.owner, notify, request.flags)
    )


@handles(pb.NotifySetImportPidRequest)
def set_import_pid(session: Session, request: pb.NotifySetImportPidRequest, reply_to: int) -> None:
    notify = _notify(session, request.notify)
    session.daemon.notifies.set_import_pid(session.owner, notify, list(request.pids))


@handles(pb.NotifyImportRequest)
def import_(
    session: Session, request: pb.NotifyImportRequest, reply_to: int
) -> pb.NotifyImportReply:
    key = check_length(request.key, IPC_KEY, "the notify key")
    notify = session.daemon.notifies.import_(
        session.owner, key, request.flags, session.daemon.peer_of(session).pid
    )
    handle = session.handles.add(notify, HandleKind.NOTIFY)
    return pb.NotifyImportReply(notify=handle, device=notify.device)


@handles(commands.RecordNotify)
def record_notify(session: Session, record: commands.RecordNotify) -> None:
    """aclrtRecordNotify (async)."""
    notify, stream = _notify(session, record.notify), session.stream(record.stream)
    session.submit(NotifyRecordTask(session.seq, stream, notify))


@handles(commands.WaitNotify)
def wait_notify(session: Session, record: commands.WaitNotify) -> None:
    """aclrtWaitAndResetNotify (async)."""
    notify, stream = _notify(session, record.notify), session.stream(record.stream)
    session.submit(NotifyWaitTask(session.seq, stream, notify, record.timeout))
