"""IPC events: export an event's handle, open another client's (server/core/ipc_events.py).
Record, wait, synchronize, query and destroy of an opened event are the events' own
handlers (server/control/handlers/events.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.ipc_events import OpenedEvent

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.IpcGetEventHandleRequest)
def get_event_handle(
    session: Session, request: pb.IpcGetEventHandleRequest, reply_to: int
) -> pb.IpcGetEventHandleReply:
    """aclrtIpcGetEventHandle: 107000 for an event not created with ACL_EVENT_IPC alone."""
    event = session.event(request.event)
    opened = request.event != event.handle
    return pb.IpcGetEventHandleReply(handle=session.daemon.ipc_events.export(event, opened))


@handles(pb.IpcOpenEventHandleRequest)
def open_event_handle(
    session: Session, request: pb.IpcOpenEventHandleRequest, reply_to: int
) -> pb.IpcOpenEventHandleReply:
    """aclrtIpcOpenEventHandle: the exported event, in this client's context."""
    context = session.context(request.context)
    event = session.daemon.ipc_events.open(request.handle)
    handle = session.handles.add(OpenedEvent(event, context), HandleKind.IPC_EVENT)
    return pb.IpcOpenEventHandleReply(event=handle)
