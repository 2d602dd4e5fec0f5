"""Streams: create, destroy, synchronize, query, failure mode, abort and stop
(Scheduler.abort), and a stream's AI-core limits (server/control/core_limits.py). The waits
they share with contexts, events and replays are server/control/synchronize.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.control import core_limits
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.synchronize import deadline, take_failure, wait_streams, when_drained
from simnpu.server.graphs.capture import not_in_capture

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.CreateStreamRequest)
def create_stream(
    session: Session, request: pb.CreateStreamRequest, reply_to: int
) -> pb.CreateStreamReply:
    """aclrtCreateStreamWithConfig: priority clamped to 0 (highest) .. 7."""
    context = session.context(request.context)
    priority = min(
        max(request.priority, codes.STREAM_PRIORITY_GREATEST), codes.STREAM_PRIORITY_LEAST
    )
    stream = session.new_stream(context, priority, request.flags)
    slot = stream.signal.slot if stream.signal is not None else None
    return pb.CreateStreamReply(stream=stream.handle, signal_slot=slot)


@handles(pb.DestroyStreamRequest)
def destroy_stream(session: Session, request: pb.DestroyStreamRequest, reply_to: int) -> object:
    """aclrtDestroyStream(Force): answers once the stream has run (or dropped) its tasks."""
    stream = session.stream(request.stream)
    if stream is stream.context.streams[0]:
        raise invalid("the default stream of a context cannot be destroyed")
    not_in_capture([stream], "aclrtDestroyStream")
    session.handles.remove(stream.handle)
    stream.destroyed = True

    def finish() -> None:
        stream.context.streams.remove(stream)
        session.stream_gone(stream)
        session.respond(reply_to)

    session.post(when_drained, session, [stream], request.force, finish)
    return LATER


@handles(pb.SynchronizeStreamRequest)
def synchronize_stream(
    session: Session, request: pb.SynchronizeStreamRequest, reply_to: int
) -> object:
    stream = session.stream(request.stream)
    not_in_capture([stream], "aclrtSynchronizeStream")
    session.post(wait_streams, session, reply_to, [stream], deadline(request.timeout_ms))
    return LATER


@handles(pb.QueryStreamRequest)
def query_stream(session: Session, request: pb.QueryStreamRequest, reply_to: int) -> object:
    """aclrtStreamQuery: complete when every task of the stream has run; a unit that wrote the
    stream's signal before the scheduler took its report counts (the client may have seen it)."""
    stream = session.stream(request.stream)
    not_in_capture([stream], "aclrtStreamQuery")

    def answer() -> None:
        failure = take_failure(session.owner, [stream])
        if failure is not None:
            session.respond_failure(reply_to, failure)
            return
        signal = stream.signal
        done = not stream.tasks or (signal is not None and signal.covers(stream.tasks[-1].seq))
        if done:
            for subscriber in session.scheduler.subscribers:
                subscriber.host_synced(session.owner, [stream])
        status = codes.ACL_STREAM_STATUS_COMPLETE if done else codes.ACL_STREAM_STATUS_NOT_READY
        session.respond(reply_to, pb.QueryStreamReply(status=status))

    session.post(answer)
    return LATER


@handles(pb.SetStreamFailureModeRequest)
def set_stream_failure_mode(
    session: Session, request: pb.SetStreamFailureModeRequest, reply_to: int
) -> object:
    stream, mode = session.stream(request.stream), request.mode
    if mode not in (codes.ACL_CONTINUE_ON_FAILURE, codes.ACL_STOP_ON_FAILURE):
        raise invalid(f"unknown failure mode {mode}")
    context = stream.context
    if context.failure_mode == codes.ACL_STOP_ON_FAILURE and mode == codes.ACL_CONTINUE_ON_FAILURE:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "a context in ACL_STOP_ON_FAILURE cannot go back to ACL_CONTINUE_ON_FAILURE",
        )

    def apply() -> None:
        context.failure_mode = mode

    return session.answer_in_order(reply_to, apply)


@handles(pb.StreamAbortRequest)
def stream_abort(session: Session, request: pb.StreamAbortRequest, reply_to: int) -> object:
    """aclrtStreamAbort / aclrtStreamStop (`stop`): answers once the stream's running work
    has been ended (and, for an abort, its queued tasks discarded)."""
    stream = session.stream(request.stream)
    return session.answer_in_order(reply_to, lambda: session.scheduler.abort(stream, request.stop))


@handles(pb.StreamResLimitRequest)
def stream_res_limit(
    session: Session, request: pb.StreamResLimitRequest, reply_to: int
) -> pb.StreamResLimitReply:
    """aclrtSetStreamResLimit (`type` set), aclrtResetStreamResLimit (`reset`) or
    aclrtGetStreamResLimit (neither): the stream's limits in force afterwards."""
    stream = session.stream(request.stream)
    cube, vector = core_limits.set_stream_limit(
        session.scheduler,
        stream,
        core_limits.ai_cores(session.device(stream.device)),
        request.type if request.HasField("type") else None,
        request.value,
        request.reset,
    )
    return pb.StreamResLimitReply(cube_limit=cube, vector_limit=vector)
