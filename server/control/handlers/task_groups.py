"""Task groups and changes of captured models (server/graphs/task_groups.py; docs/graph-capture.md,
"Updates"): aclmdlRICaptureTaskGrpBegin / End, aclmdlRICaptureTaskUpdateBegin / End,
aclmdlRITaskGetParams / SetParams, aclmdlRITaskDisable, aclmdlRIUpdate and
aclmdlRIKernelTaskGetAttribute, with the runtime's checks and codes.

Task group and update marks change state under the scheduler (`session.post`), in order with
the launches around them, as capture begin and end do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, check_num_blocks, invalid
from simnpu.server.control.handlers.kernels import launch_arguments
from simnpu.server.control.handlers.registry import LATER, handles
from simnpu.server.control.handles import HandleKind
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
from simnpu.server.core.tasks.value import WORD
from simnpu.server.graphs.capture import TASK_TYPES, Graph, capture_of
from simnpu.server.graphs.cond_handles import not_sub_model
from simnpu.server.graphs.stream_recorders import begin_update, end_update, updated_by
from simnpu.server.graphs.task_groups import TaskGroup, UpdateStatus
from simnpu.server.graphs.task_update_task import apply_launch
from simnpu.shm.addresses import device_address

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.server.control.session import Session


def _refuse(session: Session, reply_to: int, code: int, message: str) -> None:
    session.respond(reply_to, code=code, message=message)


def _in_order(session: Session, reply_to: int, change: Callable[[], Message | None]) -> object:
    """Run `change` under the scheduler in order with the session's calls before it (a replay
    queued just before counts as running) and answer with its reply or its NpuError."""

    def run() -> None:
        try:
            reply = change()
        except NpuError as error:
            _refuse(session, reply_to, error.code, error.message)
            return
        session.respond(reply_to, reply)

    session.post(run)
    return LATER


# ---- task groups --------------------------------------------------------------------------------
@handles(pb.TaskGroupRequest)
def task_group(session: Session, request: pb.TaskGroupRequest, reply_to: int) -> object:
    """aclmdlRICaptureTaskGrpBegin / End: 107029 not in capture, 107033 a group open already
    or the stream updating one (begin), none open (end); the end returns the group's handle,
    or the error a task of the group met (507009, 107034), or 507903 if the capture was
    invalidated."""
    stream = session.stream(request.stream)

    def mark() -> None:
        capture = capture_of(stream)
        if capture is None:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
                "the stream is not being captured (aclmdlRICaptureBegin first)",
            )
            return
        if not request.end:
            updating = updated_by(stream)
            if stream in capture.groups or updating is not None:
                _refuse(
                    session,
                    reply_to,
                    codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
                    "a task group is open on this stream already (aclmdlRICaptureTaskGrpEnd it)"
                    if updating is None
                    else "the stream is updating a task group (aclmdlRICaptureTaskUpdateEnd it)",
                )
                return
            capture.groups[stream] = TaskGroup(capture.graph, stream)
            session.respond(reply_to)
            return
        group = capture.groups.pop(stream, None)
        if group is None:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
                "no task group is open on this stream (aclmdlRICaptureTaskGrpBegin first)",
            )
            return
        if capture.group_error is not None:
            code, why = capture.group_error
            _refuse(session, reply_to, code, f"the task group has no handle: {why}")
            return
        if capture.invalid is not None:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                f"the capture was invalidated: {capture.invalid}",
            )
            return
        group.handle = session.handles.add(group, HandleKind.TASK_GROUP)
        capture.graph.groups.append(group)
        session.respond(reply_to, pb.TaskGroupReply(group=group.handle))

    session.post(mark)
    return LATER


@handles(pb.TaskUpdateRequest)
def task_update(session: Session, request: pb.TaskUpdateRequest, reply_to: int) -> object:
    """aclmdlRICaptureTaskUpdateBegin (`group` set) / End: 107027 on a stream in capture,
    107033 a stream updating already (begin) or not (end), or a group another stream updates;
    the end is 507000 if fewer kernels were launched than the group has."""
    stream = session.stream(request.stream)
    group = session.handles.get(request.group, TaskGroup, "task group") if request.group else None

    def mark() -> None:
        if capture_of(stream) is not None:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_STREAM_CAPTURED,
                "a stream in capture cannot update a task group (use another stream)",
            )
            return
        updated = updated_by(stream)
        if group is not None:
            if updated is not None or group.updater is not None:
                _refuse(
                    session,
                    reply_to,
                    codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
                    "the stream updates a task group already"
                    if updated is not None
                    else "another stream updates this task group now",
                )
                return
            begin_update(stream, group)
            session.respond(reply_to)
            return
        if updated is None:
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
                "the stream is not updating a task group (aclmdlRICaptureTaskUpdateBegin first)",
            )
            return
        end_update(stream, updated)
        if updated.next < len(updated.tasks):
            _refuse(
                session,
                reply_to,
                codes.ACL_ERROR_RT_INTERNAL_ERROR,
                f"the task group has {len(updated.tasks)} kernel(s) and only {updated.next} "
                "were launched to update them",
            )
            return
        session.respond(reply_to)

    session.post(mark)
    return LATER


# ---- the tasks of a model -----------------------------------------------------------------------
def _task(session: Session, handle: int) -> tuple[Task, Graph]:
    """A model task (aclmdlRIGetTasksByStream) and its model."""
    task = session.handles.get(handle, Task, "model task")
    for _, obj in list(session.handles.items()):
        if isinstance(obj, Graph) and any(task in lane.tasks for lane in obj.lanes):
            return task, obj
    raise invalid("the task's model run instance was destroyed")


def _type(task: Task) -> int:
    return TASK_TYPES.get(task.kind, codes.ACL_MODEL_RI_TASK_DEFAULT)


def _handle_of(session: Session, obj: object) -> int:
    """The handle `obj` has in the session (0: none any more)."""
    for handle, known in list(session.handles.items()):
        if known is obj:
            return handle
    return 0


def _updatable(graph: Graph) -> None:
    """107040 unless the model may be changed: not captured, not running, not failed."""
    if graph.capture is not None or graph.running or graph.status == UpdateStatus.FAULT:
        state = (
            "being captured"
            if graph.capture is not None
            else "running"
            if graph.running
            else "faulted by a failed change (destroy it)"
        )
        raise NpuError(codes.ACL_ERROR_RT_MODEL_UPDATE_FAILED, f"model {graph.id} is {state}")


@handles(pb.TaskParamsRequest)
def task_params(session: Session, request: pb.TaskParamsRequest, reply_to: int) -> object:
    """aclmdlRITaskGetParams; aclmdlRITaskSetParams (`set`): 107040 while the model is captured
    or runs; a refused change (107000) leaves the model faulted, as the runtime does."""
    task, graph = _task(session, request.task)

    def change() -> pb.TaskParamsReply | None:
        if not request.set:
            return _get_params(session, task, graph)
        _updatable(graph)
        graph.status = UpdateStatus.UPDATING
        try:
            _set_params(session, task, request)
        except NpuError:
            graph.status = UpdateStatus.FAULT
            raise
        graph.disabled.discard(task)
        return None

    return _in_order(session, reply_to, change)


def _get_params(session: Session, task: Task, graph: Graph) -> pb.TaskParamsReply:
    kind = _type(task)
    if kind == codes.ACL_MODEL_RI_TASK_DEFAULT:
        raise invalid(f"a {task.kind} task has no parameters to read (kernels, events, values do)")
    reply = pb.TaskParamsReply(type=kind)
    if isinstance(task, KernelTask):
        group = next((g for g in graph.groups if task in g.tasks), None)
        reply.task_grp = group.handle if group is not None else 0
        signature = task.function.signature
        reply.kernel.CopyFrom(
            pb.KernelTaskParams(
                function=_handle_of(session, task.function),
                num_blocks=task.num_blocks,
                args=signature.pack(*task.args) if task.args is not None else b"",
                args_size=signature.size,
            )
        )
    elif isinstance(task, (RecordTask, WaitTask, ResetTask)):
        reply.event, reply.event_flag = _handle_of(session, task.event), task.event.flags
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


def _set_params(session: Session, task: Task, request: pb.TaskParamsRequest) -> None:
    kind = request.type
    if kind == codes.ACL_MODEL_RI_TASK_KERNEL:
        if not isinstance(task, KernelTask):
            raise invalid(f"the task is a {task.kind} task, not a kernel (aclmdlRITaskGetType)")
        if request.task_grp:
            raise invalid("params taskGrp must be null when setting a task's parameters")
        params = request.kernel
        if not params.function:
            raise invalid("kernelTaskParams.funcHandle is null")
        function = session.handles.get(params.function, Function, "function")
        if not params.args and not params.args_ptr:
            raise invalid("kernelTaskParams.args is null")
        if not params.args_size:
            raise invalid("kernelTaskParams.argsSize must be greater than 0")
        check_num_blocks(params.num_blocks)
        apply_launch(task, _launch(session, task, function, params))
    elif kind in (codes.ACL_MODEL_RI_TASK_VALUE_WRITE, codes.ACL_MODEL_RI_TASK_VALUE_WAIT):
        wanted = ValueWriteTask if kind == codes.ACL_MODEL_RI_TASK_VALUE_WRITE else ValueWaitTask
        if not isinstance(task, wanted):
            raise invalid(f"the task is a {task.kind} task, not a {wanted.kind}")
        address = request.value.address
        if address % WORD.size:
            raise invalid(f"devAddr {address:#x} is not 8-byte aligned (a value is a 64-bit word)")
        span = session.device_range(address, WORD.size)
        if isinstance(task, ValueWaitTask):
            commands.check_value_flag(commands.ValueWait, request.value.flag)
            task.flag = request.value.flag
        task.span, task.value = span, request.value.value
    else:
        raise invalid(
            f"params type {kind}: only ACL_MODEL_RI_TASK_KERNEL (1), _VALUE_WRITE (5) and "
            "_VALUE_WAIT (6) tasks take new parameters"
        )


def _launch(
    session: Session, task: KernelTask, function: Function, params: pb.KernelTaskParams
) -> KernelTask:
    """A launch of `function` with the new parameters (not submitted: its payload is used)."""
    if params.args:  # host arguments: decoded now
        values = function.signature.unpack(params.args)
        values, bounds = launch_arguments(session, function, values)
        return KernelTask(task.seq, task.stream, function, params.num_blocks, values, bounds)
    address, size = params.args_ptr, params.args_size
    span = session.device_range(address, size)
    device = session.daemon.devices[span.device]

    def read_args() -> tuple[tuple, tuple]:  # device arguments: read at each run
        session.device_range(address, size)  # still this client's
        values = function.signature.unpack(
            bytes(device.region.map[span.offset : span.offset + size])
        )
        return launch_arguments(session, function, values)

    return KernelTask(task.seq, task.stream, function, params.num_blocks, None, read_args=read_args)


@handles(pb.TaskDisableRequest)
def task_disable(session: Session, request: pb.TaskDisableRequest, reply_to: int) -> object:
    """aclmdlRITaskDisable: the task does not run in the model's replays (after
    aclmdlRIUpdate). 107040 while captured or running; 107000 for a task without a type."""
    task, graph = _task(session, request.task)

    def change() -> None:
        _updatable(graph)
        graph.status = UpdateStatus.UPDATING
        if _type(task) == codes.ACL_MODEL_RI_TASK_DEFAULT:
            graph.status = UpdateStatus.FAULT
            raise invalid(f"a {task.kind} task cannot be disabled (its type is DEFAULT)")
        graph.disabled.add(task)

    return _in_order(session, reply_to, change)


@handles(pb.ModelUpdateRequest)
def model_update(session: Session, request: pb.ModelUpdateRequest, reply_to: int) -> object:
    """aclmdlRIUpdate: the changed tasks take effect; 107040 unless the model was changed or is
    ready (captured, faulted); 207000 for a built model or a sub model of a cond task, as the
    runtime's `ApiErrorDecorator::ModelUpdate` refuses them."""
    graph = session.handles.get(request.model, Graph, "model run instance")
    if graph.build is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            f"model {graph.id} was built (aclmdlRIBuildBegin), not captured: only captured "
            "models are updated",
        )
    not_sub_model(graph, "updated")

    def change() -> None:
        if graph.capture is None and graph.status == UpdateStatus.READY:
            return
        if graph.capture is not None or graph.status != UpdateStatus.UPDATING:
            raise NpuError(
                codes.ACL_ERROR_RT_MODEL_UPDATE_FAILED,
                f"model {graph.id} is "
                + ("being captured" if graph.capture is not None else "faulted by a failed change"),
            )
        graph.status = UpdateStatus.READY

    return _in_order(session, reply_to, change)


_ATTRIBUTES_KEPT = (
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE,
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE,
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP,
)
_TIMEOUTS = (codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT, codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US)


@handles(pb.KernelTaskAttributeRequest)
def kernel_task_attribute(
    session: Session, request: pb.KernelTaskAttributeRequest, reply_to: int
) -> pb.KernelTaskAttributeReply:
    """aclmdlRIKernelTaskGetAttribute: schem mode, dynamic UB size and data dump (all 0:
    simnpu's launches keep none), the operator timeout in s or µs (0: never); 107000 for
    another attribute or a task that is not a kernel."""
    task, _ = _task(session, request.task)
    if not isinstance(task, KernelTask):
        raise invalid(f"the task is a {task.kind} task, not a kernel (aclmdlRITaskGetType)")
    if request.attr in _ATTRIBUTES_KEPT:
        return pb.KernelTaskAttributeReply(value=0)
    if request.attr not in _TIMEOUTS:
        raise invalid(
            f"attrId {request.attr}: only SCHEM_MODE, DYN_UBUF_SIZE, DATA_DUMP, TIMEOUT and "
            "TIMEOUT_US can be read from a kernel task"
        )
    seconds = (
        getattr(task, "timeout_s", None)
        or task.stream.owner.op_timeout_s
        or session.scheduler.op_timeout_s
    )
    micros = 0 if math.isinf(seconds) else int(seconds * 1_000_000)
    if request.attr == codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT:
        return pb.KernelTaskAttributeReply(value=min(micros // 1_000_000, 0xFFFF))
    return pb.KernelTaskAttributeReply(value=micros)
