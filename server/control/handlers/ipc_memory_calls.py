"""IPC memory: one device buffer used by two processes (aclrtIpcMem*;
server/memory/ipc_memory.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.untrusted import IPC_KEY, check_length

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.IpcMemExportRequest)
def export(
    session: Session, request: pb.IpcMemExportRequest, reply_to: int
) -> pb.IpcMemExportReply:
    """aclrtIpcMemGetExportKey of [address, +size) inside one of the client's own blocks.
    Blocks, at the block's first export, until none of the client's work runs."""
    device, block = session.memory.exportable(request.address)
    key = session.daemon.ipc.export(
        session.owner, request.address, request.size, request.flags, block, device
    )
    try:  # its pages get a file of their own (blocks while the client's work runs)
        session.memory.share(device, request.address, request.size, session.scheduler.quiet)
    except NpuError:
        session.daemon.ipc.close(session.owner, key)
        raise
    return pb.IpcMemExportReply(key=key)


@handles(pb.IpcMemSetImportPidRequest)
def set_import_pid(session: Session, request: pb.IpcMemSetImportPidRequest, reply_to: int) -> None:
    key = check_length(request.key, IPC_KEY, "the IPC key")
    session.daemon.ipc.set_import_pid(session.owner, key, list(request.pids))


@handles(pb.IpcMemImportRequest)
def import_(
    session: Session, request: pb.IpcMemImportRequest, reply_to: int
) -> pb.IpcMemImportReply:
    key = check_length(request.key, IPC_KEY, "the IPC key")
    export = session.daemon.ipc.import_(
        session.owner, key, request.flags, session.daemon.peer_of(session).pid
    )
    session.memory.imported_now(export.key, export.address, export.size, export.device)
    for subscriber in session.scheduler.subscribers:  # checking: the import's call site
        subscriber.imported(session.owner, session.seq, export.key)
    return pb.IpcMemImportReply(address=export.address, size=export.size, device=export.device)


@handles(pb.IpcMemCloseRequest)
def close(session: Session, request: pb.IpcMemCloseRequest, reply_to: int) -> None:
    key = check_length(request.key, IPC_KEY, "the IPC key")
    if session.daemon.ipc.close(session.owner, key) is not None:
        session.memory.import_closed(key)
        session.daemon.kernels.end_owner(session.id)  # they mapped what it closed
        for subscriber in session.scheduler.subscribers:
            subscriber.import_closed(session.owner, key)
