"""Conditional tasks of captured models: aclmdlRICondHandleCreate and aclmdlRIAddCondTask
(server/graphs/cond_handles.py, server/graphs/cond_task.py; docs/graph-capture.md,
"Conditional tasks").

aclmdlRIAddCondTask records its task under the scheduler (`answer_in_order`), in order with
the tasks submitted before it, as any recorded task is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.server.control import model_handles
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.graphs import cond_handles
from simnpu.server.graphs.cond_handles import CondHandle

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


@handles(pb.CondHandleCreateRequest)
def cond_handle_create(
    session: Session, request: pb.CondHandleCreateRequest, reply_to: int
) -> pb.CondHandleCreateReply:
    """aclmdlRICondHandleCreate: the condition's handle and its device address."""
    graph = model_handles.model(session, request.model)
    device = session.daemon.devices[graph.context.device]
    cond = cond_handles.new_condition(
        graph, request.flag, request.default_value, session.memory, device
    )
    cond.handle = session.handles.add(cond, HandleKind.COND_HANDLE)
    return pb.CondHandleCreateReply(handle=cond.handle, pointer=cond.address)


@handles(pb.AddCondTaskRequest)
def add_cond_task(session: Session, request: pb.AddCondTaskRequest, reply_to: int) -> object:
    """aclmdlRIAddCondTask: a cond task recorded on the capturing stream, and the handles of
    its `size` new sub models."""
    stream = session.stream(request.stream)
    cond = session.handles.get(request.handle, CondHandle, "condition")
    cond_handles.check_cond_type(request.type)
    seq = session.seq

    def add() -> pb.AddCondTaskReply:
        subs = cond_handles.add_cond_task(
            session.scheduler,
            stream,
            seq,
            cond,
            request.type,
            request.size,
            lambda: model_handles.new_model(session, stream.context, cond),
        )
        return pb.AddCondTaskReply(sub_models=[sub.handle for sub in subs])

    return session.answer_in_order(reply_to, add)
