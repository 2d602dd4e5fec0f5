"""Streams: create, destroy, synchronize, query, failure mode -- and the waiting that
synchronizes share (aclrtSynchronizeStream / Device)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.handles import HandleKind
from simnpu.server.core.streams import Context, Stream
from simnpu.server.core.waiters import Waiter
from simnpu.server.graphs.capture import not_in_capture

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


def add_stream(session: Session, context: Context, priority: int, flags: int) -> Stream:
    """A new stream of `context`, with its completion signal if the client has a fast path;
    207008 past the client's or the device's limit."""
    limit = session.daemon.config.max_streams_per_client
    if sum(len(c.streams) for c in session.contexts if c.device == context.device) >= limit:
        raise NpuError(
            codes.ACL_ERROR_RT_NO_STREAM_RESOURCE,
            f"this client has {limit} streams on device {context.device}, the most one client "
            f"may have (simnpu serve --max-streams-per-client); the device has "
            f"{codes.MAX_STREAMS_PER_DEVICE} for all of its clients",
        )
    session.daemon.count_stream(context.device, +1)
    stream = Stream(0, context, priority, flags)
    stream.handle = session.handles.add(stream, HandleKind.STREAM)
    area = session.owner.signals
    stream.signal = area.new_signal() if area is not None else None
    context.streams.append(stream)
    return stream


def forget_stream(session: Session, stream: Stream) -> None:
    """A destroyed stream has run its last task: its count and its signal go."""
    session.daemon.count_stream(stream.device, -1)
    if stream.signal is not None and session.owner.signals is not None:
        session.owner.signals.release_signal(stream.signal)
        stream.signal = None


def signal_slot(stream: Stream) -> int | None:
    return stream.signal.slot if stream.signal is not None else None


def deadline(timeout_ms: int) -> float | None:
    """The monotonic time a wait of `timeout_ms` ends (-1: never)."""
    if timeout_ms < -1:
        raise invalid(f"timeout {timeout_ms} ms: use -1 (wait forever), 0 or a positive number")
    return None if timeout_ms == -1 else time.monotonic() + timeout_ms / 1000.0


def wait_streams(
    session: Session, reply_to: int, streams: list[Stream], until: float | None
) -> None:
    """Answer `reply_to` when `streams` have run all they had when this runs (under the
    scheduler), with the failure a synchronize reports (507046 at the deadline) and the
    client's device output."""
    targets = [(s, s.tasks[-1].seq) for s in streams if s.tasks]
    for subscriber in session.scheduler.subscribers:  # the host will have seen these finish
        subscriber.host_synced(session.owner, streams)

    def finish(timed_out: bool) -> None:
        output = session.owner.output.take()  # what kernels printed (server/units/device_printf.py)
        if timed_out:
            session.respond(
                reply_to,
                code=codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
                message="synchronize timed out",
                device_output=output,
            )
        else:
            session.respond_failure(reply_to, session.take_failure(streams), output)

    waiter = Waiter(lambda: all(s.drained_upto(seq) for s, seq in targets), finish, until)
    session.scheduler.watch(waiter, streams=[s for s, _ in targets])


@handles(pb.CreateStreamRequest)
def create_stream(
    session: Session, request: pb.CreateStreamRequest, reply_to: int
) -> pb.CreateStreamReply:
    """aclrtCreateStreamWithConfig: priority clamped to 0 (highest) .. 7."""
    context = session.context(request.context)
    priority = min(
        max(request.priority, codes.STREAM_PRIORITY_GREATEST), codes.STREAM_PRIORITY_LEAST
    )
    stream = add_stream(session, context, priority, request.flags)
    return pb.CreateStreamReply(stream=stream.handle, signal_slot=signal_slot(stream))


@handles(pb.DestroyStreamRequest)
def destroy_stream(session: Session, request: pb.DestroyStreamRequest, reply_to: int) -> object:
    """aclrtDestroyStream(Force): answers once the stream has run (or dropped) its tasks."""
    stream = session.stream(request.stream)
    if stream is stream.context.streams[0]:
        raise invalid("the default stream of a context cannot be destroyed")
    not_in_capture([stream], "aclrtDestroyStream")
    session.handles.remove(stream.handle)
    stream.destroyed = True
    scheduler = session.scheduler

    def begin() -> None:
        if request.force:
            scheduler.drop_pending(stream)
        else:
            for subscriber in scheduler.subscribers:  # the host waits for its tasks
                subscriber.host_synced(session.owner, [stream])
        scheduler.watch(
            Waiter(lambda: not stream.tasks, lambda timed_out: finish()), streams=[stream]
        )

    def finish() -> None:
        stream.context.streams.remove(stream)
        forget_stream(session, stream)
        session.respond(reply_to)

    session.post(begin)
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
        failure = session.take_failure([stream])
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
        session.respond(reply_to)

    session.post(apply)
    return LATER
