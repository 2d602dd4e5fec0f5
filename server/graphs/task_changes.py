"""Changes of a captured model's tasks without recapture (docs/graph-capture.md, "Updates"):
aclmdlRITaskGetParams / SetParams, aclmdlRITaskDisable, aclmdlRIUpdate and
aclmdlRIKernelTaskGetAttribute, with the runtime's checks and codes.

A change leaves the model UPDATING until aclmdlRIUpdate (its replays refuse to start:
server/graphs/model_runs.py); a refused change (107000) leaves it faulted, as the runtime does.
Changes run under the scheduler lock, in order with the session's calls before them (a
replay queued just before counts as running).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from simnpu.proto import codes, commands
from simnpu.proto.errors import NpuError, check_num_blocks, invalid
from simnpu.server.core.tasks import KernelTask, ValueWaitTask, ValueWriteTask
from simnpu.server.core.tasks.value import WORD
from simnpu.server.graphs.cond_handles import not_sub_model
from simnpu.server.graphs.model_runs import task_type
from simnpu.server.graphs.task_groups import UpdateStatus
from simnpu.server.graphs.task_update_task import apply_launch

if TYPE_CHECKING:
    from simnpu.proto import npu_pb2 as pb
    from simnpu.server.core.functions import Function
    from simnpu.server.core.tasks import Task
    from simnpu.server.graphs.capture import Graph
    from simnpu.server.memory.client_memory import ClientMemory

_ATTRIBUTES_KEPT = (
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE,
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE,
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP,
)
_TIMEOUTS = (codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT, codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US)


def model_of(task: Task, models: Iterable[Graph]) -> Graph:
    """The model among `models` that `task` (a handle of aclmdlRIGetTasksByStream) is a task
    of; 107000 if none is (it was destroyed)."""
    for graph in models:
        if any(task in lane.tasks for lane in graph.lanes):
            return graph
    raise invalid("the task's model run instance was destroyed")


def readable_type(task: Task) -> int:
    """aclmdlRITaskGetParams: the task's type; 107000 for one without parameters."""
    kind = task_type(task)
    if kind == codes.ACL_MODEL_RI_TASK_DEFAULT:
        raise invalid(f"a {task.kind} task has no parameters to read (kernels, events, values do)")
    return kind


def group_of(graph: Graph, task: Task) -> int:
    """The handle of the task group `task` is a kernel of (0: none)."""
    group = next((g for g in graph.groups if task in g.tasks), None)
    return group.handle if group is not None else 0


def _check_updatable(graph: Graph) -> None:
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


def set_params(
    graph: Graph,
    task: Task,
    request: pb.TaskParamsRequest,
    function_of: Callable[[int], Function],
    memory: ClientMemory,
) -> None:
    """aclmdlRITaskSetParams of a kernel (a function of `function_of`, its arguments in the
    request or in `memory`) or a value write / wait (its word in `memory`): 107040 while the
    model is captured or runs; a refused change (107000) leaves the model faulted."""
    _check_updatable(graph)
    graph.status = UpdateStatus.UPDATING
    try:
        _set_params(task, request, function_of, memory)
    except NpuError:
        graph.status = UpdateStatus.FAULT
        raise
    graph.disabled.discard(task)


def _set_params(
    task: Task,
    request: pb.TaskParamsRequest,
    function_of: Callable[[int], Function],
    memory: ClientMemory,
) -> None:
    kind = request.type
    if kind == codes.ACL_MODEL_RI_TASK_KERNEL:
        if not isinstance(task, KernelTask):
            raise invalid(f"the task is a {task.kind} task, not a kernel (aclmdlRITaskGetType)")
        if request.task_grp:
            raise invalid("params taskGrp must be null when setting a task's parameters")
        params = request.kernel
        if not params.function:
            raise invalid("kernelTaskParams.funcHandle is null")
        function = function_of(params.function)
        if not params.args and not params.args_ptr:
            raise invalid("kernelTaskParams.args is null")
        if not params.args_size:
            raise invalid("kernelTaskParams.argsSize must be greater than 0")
        check_num_blocks(params.num_blocks)
        apply_launch(task, _launch(task, function, params, memory))
    elif kind in (codes.ACL_MODEL_RI_TASK_VALUE_WRITE, codes.ACL_MODEL_RI_TASK_VALUE_WAIT):
        wanted = ValueWriteTask if kind == codes.ACL_MODEL_RI_TASK_VALUE_WRITE else ValueWaitTask
        if not isinstance(task, wanted):
            raise invalid(f"the task is a {task.kind} task, not a {wanted.kind}")
        address = request.value.address
        if address % WORD.size:
            raise invalid(f"devAddr {address:#x} is not 8-byte aligned (a value is a 64-bit word)")
        span = memory.device_range(address, WORD.size)
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
    task: KernelTask, function: Function, params: pb.KernelTaskParams, memory: ClientMemory
) -> KernelTask:
    """A launch of `function` with the new parameters (not submitted: its payload is used):
    host arguments decoded now, device arguments read at each run."""
    if params.args:
        values = function.signature.unpack(params.args)
        return KernelTask(
            task.seq, task.stream, function, params.num_blocks, values, memory.arguments
        )
    address, size = params.args_ptr, params.args_size
    memory.device_range(address, size)
    return KernelTask(
        task.seq, task.stream, function, params.num_blocks, None, memory.arguments, (address, size)
    )


def disable(graph: Graph, task: Task) -> None:
    """aclmdlRITaskDisable: the task does not run in the model's replays (after
    aclmdlRIUpdate). 107040 while captured or running; 107000 for a task without a type."""
    _check_updatable(graph)
    graph.status = UpdateStatus.UPDATING
    if task_type(task) == codes.ACL_MODEL_RI_TASK_DEFAULT:
        graph.status = UpdateStatus.FAULT
        raise invalid(f"a {task.kind} task cannot be disabled (its type is DEFAULT)")
    graph.disabled.add(task)


def check_update(graph: Graph) -> None:
    """aclmdlRIUpdate, at the call: 207000 for a built model or a sub model of a cond task,
    as the runtime's `ApiErrorDecorator::ModelUpdate` refuses them."""
    if graph.build is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            f"model {graph.id} was built (aclmdlRIBuildBegin), not captured: only captured "
            "models are updated",
        )
    not_sub_model(graph, "updated")


def update(graph: Graph) -> None:
    """aclmdlRIUpdate: the changed tasks take effect; 107040 unless the model was changed or is
    ready (captured, faulted)."""
    if graph.capture is None and graph.status == UpdateStatus.READY:
        return
    if graph.capture is not None or graph.status != UpdateStatus.UPDATING:
        raise NpuError(
            codes.ACL_ERROR_RT_MODEL_UPDATE_FAILED,
            f"model {graph.id} is "
            + ("being captured" if graph.capture is not None else "faulted by a failed change"),
        )
    graph.status = UpdateStatus.READY


def kernel_attribute(task: Task, attr: int, default_timeout_s: float) -> int:
    """aclmdlRIKernelTaskGetAttribute: schem mode, dynamic UB size and data dump (all 0:
    simnpu's launches keep none), the operator timeout in s or µs (0: never; the launch's
    own, else its session's, else `default_timeout_s`, the daemon's); 107000 for another
    attribute or a task that is not a kernel."""
    if not isinstance(task, KernelTask):
        raise invalid(f"the task is a {task.kind} task, not a kernel (aclmdlRITaskGetType)")
    if attr in _ATTRIBUTES_KEPT:
        return 0
    if attr not in _TIMEOUTS:
        raise invalid(
            f"attrId {attr}: only SCHEM_MODE, DYN_UBUF_SIZE, DATA_DUMP, TIMEOUT and "
            "TIMEOUT_US can be read from a kernel task"
        )
    seconds = (
        getattr(task, "timeout_s", None) or task.stream.owner.op_timeout_s or default_timeout_s
    )
    micros = 0 if math.isinf(seconds) else int(seconds * 1_000_000)
    if attr == codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT:
        return min(micros // 1_000_000, 0xFFFF)
    return micros
