"""Contexts: create (with its default stream), destroy, synchronize the device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.synchronize import deadline, wait_streams, when_drained
from simnpu.server.core.streams import Context
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
    stream = session.new_stream(context, 0, 0)
    slot = stream.signal.slot if stream.signal is not None else None
    return pb.CreateContextReply(
        context=context.handle, default_stream=stream.handle, signal_slot=slot
    )


@handles(pb.DestroyContextRequest)
def destroy_context(session: Session, request: pb.DestroyContextRequest, reply_to: int) -> object:
    """aclrtDestroyContext: answers once its streams have run their tasks (or, with
    drop_queued, once the tasks already started have)."""
    streams = session.forget_context(session.context(request.context))

    def finish() -> None:
        for stream in streams:
            session.stream_gone(stream)
        session.respond(reply_to)

    session.post(when_drained, session, streams, request.drop_queued, finish)
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
