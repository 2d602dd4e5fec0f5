"""Conditional tasks of captured models (server/graphs/cond_handles.py, server/graphs/cond_task.py;
docs/graph-capture.md, "Conditional tasks"): aclmdlRICondHandleCreate and
aclmdlRIAddCondTask, with the runtime's checks and codes (`ApiErrorDecorator` and
`ApiImpl::ModelCondHandleCreate`, `StreamAddCondTaskParasCheck`, `CheckCondTaskParamsSize`).

aclmdlRIAddCondTask records its task under the scheduler (`session.post`), in order with the
tasks submitted before it, as any recorded task is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.handles import HandleKind
from simnpu.server.graphs.capture import Graph, capture_of
from simnpu.server.graphs.cond_handles import VALUE, CondHandle
from simnpu.server.graphs.cond_task import CondTask

if TYPE_CHECKING:
    from simnpu.server.control.session import Session
    from simnpu.server.core.streams import Stream

MAX_BRANCHES = 4096  # sub models of one cond task (the runtime has no limit of its own)
_SIZES = {  # aclmdlRICondTaskType -> (the sizes it takes, as the runtime says them)
    codes.ACL_MODEL_RI_COND_TYPE_IF: (lambda size: size in (1, 2), "1 or 2"),
    codes.ACL_MODEL_RI_COND_TYPE_WHILE: (lambda size: size == 1, "1"),
    codes.ACL_MODEL_RI_COND_TYPE_SWITCH: (lambda size: size > 0, "greater than 0"),
}


@handles(pb.CondHandleCreateRequest)
def cond_handle_create(
    session: Session, request: pb.CondHandleCreateRequest, reply_to: int
) -> pb.CondHandleCreateReply:
    """aclmdlRICondHandleCreate: 107000 for a flag other than 0 or ASSIGN_DEFAULT or a model
    not being captured (or whose capture was invalidated); 207000 for a built model (not a
    captured one). The condition, 0 at first, is a uint64 of device memory the model owns."""
    graph = session.handles.get(request.model, Graph, "model run instance")
    if request.flag > codes.ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT:
        raise invalid(f"flag {request.flag}: use 0 or ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT")
    if graph.build is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            f"model {graph.id} was built (aclmdlRIBuildBegin), not captured: "
            "conditions belong to captured models",
        )
    capture = graph.capture
    if capture is None or capture.invalid is not None:
        raise invalid(
            f"model {graph.id} is not in the capture stage (or its capture was invalidated)"
        )
    device = session.daemon.devices[graph.context.device]
    address = session.memory.allocate(device, VALUE.size, codes.ACL_MEM_MALLOC_HUGE_FIRST)
    span = session.memory.span(address)
    VALUE.pack_into(device.region.map, span.offset, 0)
    cond = CondHandle(0, graph, request.default_value, request.flag, address, span)
    cond.handle = session.handles.add(cond, HandleKind.COND_HANDLE)
    graph.conds.append(cond)
    return pb.CondHandleCreateReply(handle=cond.handle, pointer=address)


@handles(pb.AddCondTaskRequest)
def add_cond_task(session: Session, request: pb.AddCondTaskRequest, reply_to: int) -> object:
    """aclmdlRIAddCondTask: a cond task recorded on the capturing stream, and its `size` new
    sub models. 107000 for a handle used already, a stream captured into another model than
    the handle's, or a size its type does not take; 107029 for a stream not in capture."""
    stream = session.stream(request.stream)
    cond = session.handles.get(request.handle, CondHandle, "condition")
    if request.type not in _SIZES:
        raise invalid(f"type {request.type}: use an aclmdlRICondTaskType")

    seq = session.seq

    def add() -> None:
        try:
            sub_models = _add(session, stream, seq, cond, request)
        except NpuError as error:
            session.respond(reply_to, code=error.code, message=error.message)
            return
        session.respond(reply_to, pb.AddCondTaskReply(sub_models=sub_models))

    session.post(add)
    return LATER


def _add(
    session: Session, stream: Stream, seq: int, cond: CondHandle, request: pb.AddCondTaskRequest
) -> list[int]:
    """The runtime's checks in its order; then the sub models and the recorded task."""
    capture = capture_of(stream)
    if cond.subs:
        raise invalid("the condition is used by a cond task already: create another one")
    if capture is None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
            "the stream must be in capture (aclmdlRICaptureBegin) to add a cond task",
        )
    if capture.graph is not cond.graph:
        raise invalid(
            f"the condition belongs to model {cond.graph.id}, the stream is captured into "
            f"model {capture.graph.id}"
        )
    takes, sizes = _SIZES[request.type]
    if not takes(request.size):
        raise invalid(f"size {request.size}: this cond task type takes {sizes}")
    if request.size > MAX_BRANCHES:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            f"size {request.size}: a cond task of more than {MAX_BRANCHES} sub models is not "
            "simulated",
        )
    cond.type = request.type
    for _ in range(request.size):
        sub = Graph(0, session.daemon.next_model_id(), stream.context, cond=cond)
        sub.handle = session.handles.add(sub, HandleKind.MODEL_RI)
        cond.subs.append(sub)
    session.scheduler.submit(CondTask(seq, stream, cond))
    return [sub.handle for sub in cond.subs]
