"""Labels of built models: aclrtCreateLabel, aclrtCreateLabelList, aclrtDestroyLabel,
aclrtDestroyLabelList, aclrtSetLabel and aclrtSwitchLabelByIndex (server/graphs/model_build.py,
server/graphs/flow_tasks.py; docs/model-build.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import invalid
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.model_build import bound
from simnpu.server.control.handlers.registry import handles
from simnpu.server.graphs.flow_tasks import LabelTask, SwitchLabelTask
from simnpu.server.graphs.model_build import Label, LabelList

if TYPE_CHECKING:
    from simnpu.server.control.session import Session

_INDEX_SIZE = 4  # the index is a uint32


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
    """aclrtSetLabel: the label marks the next place of a bound stream (107005 for a stream
    not bound to a model, 107000 for a label set already)."""
    label = session.handles.get(request.label, Label, "label")
    stream = session.stream(request.stream)
    build = bound(stream)
    if label.lane is not None:
        raise invalid("the label is set already (a label marks one place)")
    task = LabelTask(session.seq, stream, label)
    label.lane, label.marker = build.lanes[stream], task
    session.submit(task)


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
    bound(stream)
    session.submit(SwitchLabelTask(session.seq, stream, index, request.max_value, labels))
