"""Contexts: create (with its default stream), destroy, synchronize the device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.handlers.streams import (
    add_stream,
    deadline,
    forget_stream,
    signal_slot,
    wait_streams,
)
from simnpu.server.control.handles import HandleKind
from simnpu.server.core.ipc_events import OpenedEvent
from simnpu.server.core.streams import Context, Event
from simnpu.server.core.waiters import Waiter
from simnpu.server.graphs.capture import not_in_capture

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.CreateContextRequest)
def create_context(
    session: Session, request: pb.CreateContextRequest, reply_to: int
) -> pb.CreateContextReply:
    device = session.device(request.device)
    context = Context(0, device.index, session.owner)
    context.handle = session.handles.add(context, HandleKind.CONTEXT)
    session.contexts.append(context)
    stream = add_stream(session, context, 0, 0)
    return pb.CreateContextReply(
        context=context.handle, default_stream=stream.handle, signal_slot=signal_slot(stream)
    )


@handles(pb.DestroyContextRequest)
def destroy_context(session: Session, request: pb.DestroyContextRequest, reply_to: int) -> object:
    """aclrtDestroyContext: answers once its streams have run their tasks (or, with
    drop_queued, once the tasks already started have)."""
    context = session.context(request.context)
    session.handles.remove(context.handle)
    session.contexts.remove(context)
    streams = list(context.streams)
    for stream in streams:
        stream.destroyed = True
        session.handles.remove(stream.handle)
    for handle, obj in session.handles.items():
        if isinstance(obj, Event) and obj.context is context:
            session.handles.remove(handle)
            session.daemon.count_event(context.device, -1)
            session.daemon.ipc_events.withdraw(obj)
        elif isinstance(obj, OpenedEvent) and obj.context is context:
            session.handles.remove(handle)
    scheduler = session.scheduler

    def begin() -> None:
        if request.drop_queued:
            for stream in streams:
                scheduler.drop_pending(stream)
        else:
            for subscriber in scheduler.subscribers:  # the host waits for their tasks
                subscriber.host_synced(session.owner, streams)
        waiter = Waiter(lambda: all(not s.tasks for s in streams), lambda timed_out: finish())
        scheduler.watch(waiter, streams=streams)

    def finish() -> None:
        for stream in streams:
            forget_stream(session, stream)
        session.respond(reply_to)

    session.post(begin)
    return LATER


@handles(pb.SynchronizeDeviceRequest)
def synchronize_device(
    session: Session, request: pb.SynchronizeDeviceRequest, reply_to: int
) -> object:
    """aclrtSynchronizeDevice(WithTimeout): every stream of this client on the device."""
    device = session.device(request.device)
    streams = [s for c in session.contexts if c.device == device.index for s in c.streams]
    not_in_capture(streams, "aclrtSynchronizeDevice")
    session.post(wait_streams, session, reply_to, streams, deadline(request.timeout_ms))
    return LATER
