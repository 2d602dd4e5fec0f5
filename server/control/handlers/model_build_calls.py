"""Explicitly built models: aclmdlRIBuildBegin, aclmdlRIBindStream / UnbindStream,
aclmdlRIEndTask, aclmdlRIBuildEnd, the stream control flow of their bound streams
(aclrtActiveStream, aclrtSwitchStream) and their labels (aclrtCreateLabel(List),
aclrtDestroyLabel(List), aclrtSetLabel, aclrtSwitchLabelByIndex). What they do is
server/graphs/model_build.py, the tasks server/graphs/flow_tasks.py; docs/model-build.md.

Binding, unbinding and the end run under the scheduler (`answer_in_order`), in order with
the commands before them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import invalid
from simnpu.server.control import model_handles
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.graphs import model_build, model_runs
from simnpu.server.graphs.flow_tasks import (
    ActivateTask,
    EndGraphTask,
    SwitchLabelTask,
    SwitchStreamTask,
)
from simnpu.server.graphs.model_build import Build, Label, LabelList

if TYPE_CHECKING:
    from simnpu.server.control.session import Session

_INDEX_SIZE = 4  # the index of aclrtSwitchLabelByIndex is a uint32


def _built(session: Session, handle: int) -> Build:
    return model_build.built(model_handles.model(session, handle))


@handles(pb.BuildBeginRequest)
def build_begin(
    session: Session, request: pb.BuildBeginRequest, reply_to: int
) -> pb.BuildBeginReply:
    """aclmdlRIBuildBegin: a new, empty model of the calling thread's context."""
    model_build.check_build_flag(request.flag)
    graph = model_handles.new_model(session, session.context(request.context))
    graph.build = Build(graph)
    return pb.BuildBeginReply(model=graph.handle)


@handles(pb.BindStreamRequest)
def bind_stream(session: Session, request: pb.BindStreamRequest, reply_to: int) -> object:
    """aclmdlRIBindStream / aclmdlRIUnbindStream (`unbind`)."""
    build = _built(session, request.model)
    stream = session.stream(request.stream)

    def change() -> None:
        if request.unbind:
            model_build.unbind(build, stream)
        else:
            model_build.bind(build, stream, request.flag, lambda: model_handles.new_lane(session))

    return session.answer_in_order(reply_to, change)


@handles(pb.EndTaskRequest)
def end_task(session: Session, request: pb.EndTaskRequest, reply_to: int) -> None:
    """aclmdlRIEndTask: the end-of-graph task on a bound stream (107005 if not bound to the
    model, 107027 in capture)."""
    build = _built(session, request.model)
    stream = session.stream(request.stream)
    model_build.not_capturing(stream)
    model_build.bound(stream, build)
    session.submit(EndGraphTask(session.seq, stream))


@handles(pb.BuildEndRequest)
def build_end(session: Session, request: pb.BuildEndRequest, reply_to: int) -> object:
    """aclmdlRIBuildEnd: the model may be replayed; what it recorded."""
    build = _built(session, request.model)

    def end() -> pb.BuildEndReply:
        seqs, callbacks = model_runs.recorded_calls(model_build.end(build))
        return pb.BuildEndReply(seqs=seqs, callbacks=callbacks)

    return session.answer_in_order(reply_to, end)


@handles(pb.ActiveStreamRequest)
def active_stream(session: Session, request: pb.ActiveStreamRequest, reply_to: int) -> None:
    """aclrtActiveStream: a task that starts another stream of the same model (107005 if
    either stream is not bound to it)."""
    stream = session.stream(request.stream)
    target = session.stream(request.active_stream)
    build = model_build.bound(stream)
    model_build.bound(target, build)
    session.submit(ActivateTask(session.seq, stream, build.lanes[target]))


@handles(pb.SwitchStreamRequest)
def switch_stream(session: Session, request: pb.SwitchStreamRequest, reply_to: int) -> None:
    """aclrtSwitchStream: a task that starts true_stream when the condition holds (107000
    for an unknown condition or data type, or values outside the client's device memory;
    107005 if a stream is not bound to the model)."""
    stream = session.stream(request.stream)
    target = session.stream(request.true_stream)
    size = model_build.switch_value_size(request.condition, request.data_type)
    left = session.memory.device_range(request.left, size)
    right = session.memory.device_range(request.right, size)
    build = model_build.bound(stream)
    model_build.bound(target, build)
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


# ---- labels -------------------------------------------------------------------------------------
@handles(pb.LabelCreateRequest)
def label_create(
    session: Session, request: pb.LabelCreateRequest, reply_to: int
) -> pb.LabelCreateReply:
    """aclrtCreateLabel / aclrtCreateLabelList (107017 for a label that is not one)."""
    if not request.list:
        label = Label(0)
        label.handle = session.handles.add(label, HandleKind.LABEL)
        return pb.LabelCreateReply(handle=label.handle)
    if not request.labels:
        raise invalid("a label list needs at least one label")
    labels = [session.handles.get(handle, Label, "label") for handle in request.labels]
    made = LabelList(0, labels)
    made.handle = session.handles.add(made, HandleKind.LABEL_LIST)
    return pb.LabelCreateReply(handle=made.handle)


@handles(pb.LabelDestroyRequest)
def label_destroy(session: Session, request: pb.LabelDestroyRequest, reply_to: int) -> None:
    """aclrtDestroyLabel / aclrtDestroyLabelList (107017 for a handle that is not one); a
    model that jumps to the label keeps it."""
    kind, what = (LabelList, "label list") if request.list else (Label, "label")
    session.handles.get(request.handle, kind, what)
    session.handles.remove(request.handle)


@handles(pb.SetLabelRequest)
def set_label(session: Session, request: pb.SetLabelRequest, reply_to: int) -> None:
    """aclrtSetLabel: the label marks the next place of a bound stream."""
    label = session.handles.get(request.label, Label, "label")
    stream = session.stream(request.stream)
    session.submit(model_build.set_label(session.seq, stream, label))


@handles(pb.SwitchLabelRequest)
def switch_label(session: Session, request: pb.SwitchLabelRequest, reply_to: int) -> None:
    """aclrtSwitchLabelByIndex: a task that jumps to the label of the list whose index is
    the uint32 at `index` (107000 for maxValue 0 or an index outside the client's device
    memory, 107005 for a stream not bound to a model)."""
    labels = session.handles.get(request.label_list, LabelList, "label list").labels
    stream = session.stream(request.stream)
    if request.max_value <= 0:
        raise invalid(f"maxValue {request.max_value}: at least 1 label to jump to")
    index = session.memory.device_range(request.index, _INDEX_SIZE)
    model_build.bound(stream)
    session.submit(SwitchLabelTask(session.seq, stream, index, request.max_value, labels))
