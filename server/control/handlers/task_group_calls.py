"""Task groups and changes of captured models (docs/graph-capture.md, "Updates"):
aclmdlRICaptureTaskGrpBegin / End, aclmdlRICaptureTaskUpdateBegin / End
(server/graphs/stream_recorders.py), aclmdlRITaskGetParams / SetParams, aclmdlRITaskDisable,
aclmdlRIUpdate and aclmdlRIKernelTaskGetAttribute (server/graphs/task_changes.py).

Each runs under the scheduler (`answer_in_order`), in order with the launches around it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.proto import npu_pb2 as pb
from simnpu.server.control import model_handles
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import handles
from simnpu.server.core.functions import Function
from simnpu.server.core.tasks import (
    KernelTask,
    RecordTask,
    ResetTask,
    Task,
    ValueWaitTask,
    ValueWriteTask,
    WaitTask,
)
from simnpu.server.graphs import stream_recorders, task_changes
from simnpu.server.graphs.capture import Graph
from simnpu.server.graphs.task_groups import TaskGroup
from simnpu.shm.addresses import device_address

if TYPE_CHECKING:
    from simnpu.server.control.session import Session


# ---- task groups --------------------------------------------------------------------------------
@handles(pb.TaskGroupRequest)
def task_group(session: Session, request: pb.TaskGroupRequest, reply_to: int) -> object:
    """aclmdlRICaptureTaskGrpBegin / End (`end`): the end returns the group's handle."""
    stream = session.stream(request.stream)

    def mark() -> pb.TaskGroupReply | None:
        if not request.end:
            stream_recorders.begin_group(stream)
            return None
        group = stream_recorders.end_group(stream)
        group.handle = session.handles.add(group, HandleKind.TASK_GROUP)
        return pb.TaskGroupReply(group=group.handle)

    return session.answer_in_order(reply_to, mark)


@handles(pb.TaskUpdateRequest)
def task_update(session: Session, request: pb.TaskUpdateRequest, reply_to: int) -> object:
    """aclmdlRICaptureTaskUpdateBegin (`group` set) / End."""
    stream = session.stream(request.stream)
    group = session.handles.get(request.group, TaskGroup, "task group") if request.group else None

    def mark() -> None:
        if group is not None:
            stream_recorders.begin_update(stream, group)
        else:
            stream_recorders.end_update(stream)

    return session.answer_in_order(reply_to, mark)


# ---- the tasks of a model -----------------------------------------------------------------------
def _task(session: Session, handle: int) -> tuple[Task, Graph]:
    """A model task (aclmdlRIGetTasksByStream) and its model."""
    task = session.handles.get(handle, Task, "model task")
    models = (obj for _, obj in session.handles.items() if isinstance(obj, Graph))
    return task, task_changes.model_of(task, models)


@handles(pb.TaskParamsRequest)
def task_params(session: Session, request: pb.TaskParamsRequest, reply_to: int) -> object:
    """aclmdlRITaskGetParams; aclmdlRITaskSetParams (`set`)."""
    task, graph = _task(session, request.task)

    def change() -> pb.TaskParamsReply | None:
        if not request.set:
            return _params(session, task, graph)
        task_changes.set_params(
            graph,
            task,
            request,
            lambda handle: session.handles.get(handle, Function, "function"),
            session.memory,
        )
        return None

    return session.answer_in_order(reply_to, change)


def _params(session: Session, task: Task, graph: Graph) -> pb.TaskParamsReply:
    """The reply of aclmdlRITaskGetParams: a kernel's, an event task's or a value task's."""
    reply = pb.TaskParamsReply(type=task_changes.readable_type(task))
    if isinstance(task, KernelTask):
        reply.task_grp = task_changes.group_of(graph, task)
        signature = task.function.signature
        reply.kernel.CopyFrom(
            pb.KernelTaskParams(
                function=session.handles.handle_of(task.function),
                num_blocks=task.num_blocks,
                args=signature.pack(*task.args) if task.args is not None else b"",
                args_size=signature.size,
            )
        )
    elif isinstance(task, (RecordTask, WaitTask, ResetTask)):
        reply.event, reply.event_flag = session.handles.handle_of(task.event), task.event.flags
    elif isinstance(task, (ValueWriteTask, ValueWaitTask)):
        span = task.span
        reply.value.CopyFrom(
            pb.ValueTaskParams(
                address=device_address(span.device, span.offset),
                value=task.value,
                flag=task.flag if isinstance(task, ValueWaitTask) else 0,
            )
        )
    return reply


@handles(pb.TaskDisableRequest)
def task_disable(session: Session, request: pb.TaskDisableRequest, reply_to: int) -> object:
    """aclmdlRITaskDisable."""
    task, graph = _task(session, request.task)
    return session.answer_in_order(reply_to, lambda: task_changes.disable(graph, task))


@handles(pb.ModelUpdateRequest)
def model_update(session: Session, request: pb.ModelUpdateRequest, reply_to: int) -> object:
    """aclmdlRIUpdate."""
    graph = model_handles.model(session, request.model)
    task_changes.check_update(graph)
    return session.answer_in_order(reply_to, lambda: task_changes.update(graph))


@handles(pb.KernelTaskAttributeRequest)
def kernel_task_attribute(
    session: Session, request: pb.KernelTaskAttributeRequest, reply_to: int
) -> pb.KernelTaskAttributeReply:
    """aclmdlRIKernelTaskGetAttribute."""
    task, _ = _task(session, request.task)
    value = task_changes.kernel_attribute(task, request.attr, session.scheduler.op_timeout_s)
    return pb.KernelTaskAttributeReply(value=value)
