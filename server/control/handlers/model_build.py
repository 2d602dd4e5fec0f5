"""Explicitly built models: aclmdlRIBuildBegin, aclmdlRIBindStream / UnbindStream,
aclmdlRIEndTask, aclmdlRIBuildEnd, and the stream control flow of their bound streams,
aclrtActiveStream and aclrtSwitchStream (server/graphs/model_build.py; docs/model-build.md).

Binding and unbinding run under the scheduler (`session.post`), in order with the commands
before them: a task sent before aclmdlRIBindStream runs, one sent after is recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.handles import HandleKind
from simnpu.server.core.tasks import HostCallbackTask
from simnpu.server.graphs.capture import Graph, Lane, capture_of
from simnpu.server.graphs.flow_tasks import (
    ActivateTask,
    EndGraphTask,
    SwitchLabelTask,
    SwitchStreamTask,
    value_size,
)
from simnpu.server.graphs.model_build import Build
from simnpu.server.graphs.stream_recorders import bound_to

if TYPE_CHECKING:
    from simnpu.server.control.session import Session
    from simnpu.server.core.streams import Stream

_CONDITIONS = range(codes.ACL_RT_EQUAL, codes.ACL_RT_LESS_OR_EQUAL + 1)
_DATA_TYPES = (codes.ACL_RT_SWITCH_INT32, codes.ACL_RT_SWITCH_INT64)


def built(session: Session, handle: int) -> Build:
    """The building state of model `handle`; 107000 for a captured model."""
    graph = session.handles.get(handle, Graph, "model run instance")
    if graph.build is None:
        raise invalid(
            f"model {graph.id} was captured (aclmdlRICaptureBegin): only a model of "
            "aclmdlRIBuildBegin has bound streams"
        )
    return graph.build


def bound(stream: Stream, build: Build | None = None) -> Build:
    """The model `stream` is bound to (`build` when given); else 107005."""
    current = bound_to(stream)
    if current is None or (build is not None and current is not build):
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_MODEL,
            "the stream is not bound to the model (aclmdlRIBindStream it first)"
            if build is not None
            else "the stream is not bound to a model (aclmdlRIBindStream it first)",
        )
    return current


def not_capturing(stream: Stream) -> None:
    if capture_of(stream) is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_CAPTURED,
            "the stream is being captured (aclmdlRICaptureEnd it first)",
        )


@handles(pb.BuildBeginRequest)
def build_begin(
    session: Session, request: pb.BuildBeginRequest, reply_to: int
) -> pb.BuildBeginReply:
    """aclmdlRIBuildBegin: a new, empty model of the calling thread's context."""
    if request.flag:
        raise invalid(f"flag {request.flag}: it is reserved and must be 0")
    context = session.context(request.context)
    graph = Graph(0, session.daemon.next_model_id(), context)
    graph.build = Build(graph)
    graph.handle = session.handles.add(graph, HandleKind.MODEL_RI)
    return pb.BuildBeginReply(model=graph.handle)


@handles(pb.BindStreamRequest)
def bind_stream(session: Session, request: pb.BindStreamRequest, reply_to: int) -> object:
    """aclmdlRIBindStream / aclmdlRIUnbindStream: 107000 for a captured model or (bind) a
    stream without ACL_STREAM_PERSISTENT, 107027 a stream in capture, 207000 a stream with
    ACL_STREAM_FAST_LAUNCH, 107004 a stream of another context, 107005 a stream bound
    already (bind) or not to this model (unbind)."""
    build = built(session, request.model)
    stream = session.stream(request.stream)

    def change() -> None:
        try:
            not_capturing(stream)
            if request.unbind:
                bound(stream, build).unbind(stream)
            else:
                _bind(session, build, stream, request.flag)
        except NpuError as error:
            session.respond(reply_to, code=error.code, message=error.message)
            return
        session.respond(reply_to)

    session.post(change)
    return LATER


def _bind(session: Session, build: Build, stream: Stream, flag: int) -> None:
    if stream.flags & codes.ACL_STREAM_FAST_LAUNCH:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "a stream with ACL_STREAM_FAST_LAUNCH cannot be bound to a model",
        )
    if not stream.flags & codes.ACL_STREAM_PERSISTENT:
        raise invalid(
            "only a persistent stream (aclrtCreateStreamWithConfig with "
            "ACL_STREAM_PERSISTENT) can be bound to a model"
        )
    current = bound_to(stream)
    if current is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_MODEL,
            f"the stream is bound to model {current.graph.id} already",
        )
    if stream.context is not build.graph.context:
        raise NpuError(
            codes.ACL_ERROR_RT_MODEL_CONTEXT,
            "the stream is of another context than the model",
        )
    lane = Lane(0)
    lane.handle = session.handles.add(lane, HandleKind.MODEL_STREAM)
    build.bind(stream, lane, head=flag == codes.ACL_MODEL_STREAM_FLAG_HEAD)


@handles(pb.EndTaskRequest)
def end_task(session: Session, request: pb.EndTaskRequest, reply_to: int) -> None:
    """aclmdlRIEndTask: the end-of-graph task on a bound stream (107005 if not bound to the
    model, 107027 in capture)."""
    build = built(session, request.model)
    stream = session.stream(request.stream)
    not_capturing(stream)
    bound(stream, build)
    session.submit(EndGraphTask(session.seq, stream))


@handles(pb.BuildEndRequest)
def build_end(session: Session, request: pb.BuildEndRequest, reply_to: int) -> object:
    """aclmdlRIBuildEnd: the model may be replayed. 107000 if a bound stream got a task that
    cannot be part of a model; 207000 if a label jump goes backwards or to another stream
    (not simulated)."""
    build = built(session, request.model)

    def end() -> None:
        why = build.refused or _backward_jump(build)
        if why is not None:
            code = codes.ACL_ERROR_RT_PARAM_INVALID
            if build.refused is None:
                code = codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
            session.respond(reply_to, code=code, message=why)
            return
        build.ended = True
        recorded = [task for _, task in build.graph.order]
        session.respond(
            reply_to,
            pb.BuildEndReply(
                seqs=[task.seq for task in recorded],
                callbacks=[t.callback for t in recorded if isinstance(t, HostCallbackTask)],
            ),
        )

    session.post(end)
    return LATER


def _backward_jump(build: Build) -> str | None:
    """Why a label switch of the model cannot be simulated, if one cannot: each of its
    labels must be set after it on its own stream (a forward jump)."""
    for lane in build.graph.lanes:
        for position, task in enumerate(lane.tasks):
            if not isinstance(task, SwitchLabelTask):
                continue
            for label in task.labels[: task.max_value]:
                marker = label.marker
                if label.lane is not lane or marker is None or lane.tasks.index(marker) < position:
                    return (
                        f"task {task.seq} jumps to a label that is not set after it on its "
                        "stream: only forward jumps within a stream are simulated"
                    )
    return None


@handles(pb.ActiveStreamRequest)
def active_stream(session: Session, request: pb.ActiveStreamRequest, reply_to: int) -> None:
    """aclrtActiveStream: a task that starts another stream of the same model (107005 if
    either stream is not bound to it)."""
    stream = session.stream(request.stream)
    target = session.stream(request.active_stream)
    build = bound(stream)
    bound(target, build)
    session.submit(ActivateTask(session.seq, stream, build.lanes[target]))


@handles(pb.SwitchStreamRequest)
def switch_stream(session: Session, request: pb.SwitchStreamRequest, reply_to: int) -> None:
    """aclrtSwitchStream: a task that starts true_stream when the condition holds (107000
    for an unknown condition or data type, or values outside the client's device memory;
    107005 if a stream is not bound to the model)."""
    stream = session.stream(request.stream)
    target = session.stream(request.true_stream)
    if request.condition not in _CONDITIONS:
        raise invalid(f"condition {request.condition}: use an aclrtCondition")
    if request.data_type not in _DATA_TYPES:
        raise invalid(f"dataType {request.data_type}: use an aclrtCompareDataType")
    size = value_size(request.data_type)
    left = session.device_range(request.left, size)
    right = session.device_range(request.right, size)
    build = bound(stream)
    bound(target, build)
    session.submit(
        SwitchStreamTask(
            session.seq,
            stream,
            build.lanes[target],
            left,
            right,
            request.condition,
            request.data_type,
        )
    )
