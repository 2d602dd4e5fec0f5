"""rt.task_groups: task groups and task changes of model run instances -- a sub-part of
rt.graphs (client/runtime/graphs.py), which keeps the models and their listed tasks. The
groups, the updates and the models' state are the daemon's (server/graphs/task_groups.py;
docs/graph-capture.md, "Updates").

Parameters are pyACL dicts with the C field names in snake case (aclmdlRITaskParams,
aclrtLaunchKernelAttrValue). A kernel task's argument struct read back by
aclmdlRITaskGetParams is a host copy this process keeps (`is_host_args` 1) until the next
read of that task.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.shm.addresses import DEVICE_BASE

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.runtime.graphs import Graphs
    from simnpu.client.runtime.shared import Shared

_EVENT_PARAMS = {  # aclmdlRITaskType -> (the union member, its flag field)
    codes.ACL_MODEL_RI_TASK_EVENT_RECORD: ("event_record_task_params", "record_flag"),
    codes.ACL_MODEL_RI_TASK_EVENT_WAIT: ("event_wait_task_params", "wait_flag"),
    codes.ACL_MODEL_RI_TASK_EVENT_RESET: ("event_reset_task_params", "reset_flag"),
}
_VALUE_PARAMS = {
    codes.ACL_MODEL_RI_TASK_VALUE_WRITE: "value_write_task_params",
    codes.ACL_MODEL_RI_TASK_VALUE_WAIT: "value_wait_task_params",
}
_ATTRIBUTE_FIELDS = {  # aclrtLaunchKernelAttrId -> its aclrtLaunchKernelAttrValue field
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE: "schem_mode",
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE: "dyn_ubuf_size",
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP: "is_data_dump",
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT: "timeout",
}


def _null(name: str) -> NpuError:
    """ACL's own null check (100000)."""
    return NpuError(codes.ACL_ERROR_INVALID_PARAM, f"{name} is null")


def _runtime_null(name: str) -> NpuError:
    """The runtime's null check (107000), for calls ACL passes on unchecked."""
    return NpuError(codes.ACL_ERROR_RT_PARAM_INVALID, f"{name} is null")


class TaskGroups:
    """Task group and task change calls (see the module docstring)."""

    def __init__(self, shared: Shared, graphs: Graphs):
        self._calls, self._contexts = shared.calls, shared.contexts
        self._graphs = graphs  # the models and their listed tasks (rt.graphs)

    # ---- task groups ---------------------------------------------------------------------------
    @records_errors
    def task_grp_begin(self, stream: int, site: str | None = None) -> None:
        """aclmdlRICaptureTaskGrpBegin: the stream's next recorded kernels form a group.
        107029 not in capture, 107033 a group open already. Blocks."""
        if not stream:
            raise _null("stream")
        self._calls.request(pb.TaskGroupRequest(stream=self._contexts.stream(stream)), site)

    @records_errors
    def task_grp_end(self, stream: int, site: str | None = None) -> int:
        """aclmdlRICaptureTaskGrpEnd: the group's handle. 107029 not in capture, 107033 no
        group open, 507009 / 107034 a task the group refused, 507903 invalidated. Blocks."""
        if not stream:
            raise _null("stream")
        request = pb.TaskGroupRequest(stream=self._contexts.stream(stream), end=True)
        return self._calls.request(request, site).group

    @records_errors
    def task_update_begin(self, stream: int, group: int, site: str | None = None) -> None:
        """aclmdlRICaptureTaskUpdateBegin: the kernels launched on `stream` from now on
        update the group's kernels, in order, when the stream reaches them. 107027 a stream
        in capture, 107033 one updating already or a group another stream updates. Blocks."""
        if not stream:
            raise _null("stream")
        if not group:
            raise _null("handle")
        request = pb.TaskUpdateRequest(stream=self._contexts.stream(stream), group=group)
        self._calls.request(request, site)

    @records_errors
    def task_update_end(self, stream: int, site: str | None = None) -> None:
        """aclmdlRICaptureTaskUpdateEnd: 107033 not updating; 507000 if the group has
        kernels no launch updated. Blocks."""
        if not stream:
            raise _null("stream")
        self._calls.request(pb.TaskUpdateRequest(stream=self._contexts.stream(stream)), site)

    # ---- the tasks of a model ------------------------------------------------------------------
    @records_errors
    def task_get_params(self, task: int, site: str | None = None) -> dict:
        """aclmdlRITaskGetParams: the task's aclmdlRITaskParams. 107000 for a task of type
        DEFAULT."""
        if not task:
            raise _runtime_null("task")
        reply = self._calls.request(pb.TaskParamsRequest(task=task), site)
        params: dict = {
            "type": reply.type,
            "task_grp": reply.task_grp,
            "op_info_ptr": 0,
            "op_info_size": 0,
        }
        if reply.type == codes.ACL_MODEL_RI_TASK_KERNEL:
            kernel = reply.kernel
            args = 0
            if kernel.args:
                buffer = ctypes.create_string_buffer(kernel.args, len(kernel.args))
                self._graphs.keep_task_args(task, buffer)
                args = ctypes.addressof(buffer)
            params["kernel_task_params"] = {
                "func_handle": kernel.function,
                "cfg": None,
                "args": args,
                "is_host_args": 1 if args else 0,
                "args_size": kernel.args_size,
                "num_blocks": kernel.num_blocks,
            }
        elif reply.type in _EVENT_PARAMS:
            member, flag = _EVENT_PARAMS[reply.type]
            params[member] = {"event": reply.event, "event_flag": reply.event_flag, flag: 0}
        elif reply.type in _VALUE_PARAMS:
            value = {"dev_addr": reply.value.address, "value": reply.value.value}
            if reply.type == codes.ACL_MODEL_RI_TASK_VALUE_WAIT:
                value["flag"] = reply.value.flag
            params[_VALUE_PARAMS[reply.type]] = value
        return params

    @records_errors
    def task_set_params(self, task: int, params: Any, site: str | None = None) -> None:
        """aclmdlRITaskSetParams: new parameters for a kernel, value write or value wait task
        (aclmdlRIUpdate makes them take effect). 107040 while the model is captured or runs;
        107000 for wrong ones, which leaves the model faulted as in the runtime."""
        if not task:
            raise _runtime_null("task")
        if not isinstance(params, dict):
            raise _runtime_null("params")
        kind = params.get("type")
        if not isinstance(kind, int):
            raise invalid("params must have an int 'type' (aclmdlRITaskType)")
        request = pb.TaskParamsRequest(
            task=task, set=True, type=kind, task_grp=_int(params.get("task_grp", 0), "task_grp")
        )
        if kind == codes.ACL_MODEL_RI_TASK_KERNEL:
            request.kernel.CopyFrom(_kernel_params(params.get("kernel_task_params")))
        elif kind in _VALUE_PARAMS:
            value = params.get(_VALUE_PARAMS[kind])
            if not isinstance(value, dict):
                raise invalid(f"params must have a {_VALUE_PARAMS[kind]} dict")
            request.value.CopyFrom(
                pb.ValueTaskParams(
                    address=_int(value.get("dev_addr", 0), "dev_addr"),
                    value=_int(value.get("value", 0), "value"),
                    flag=_int(value.get("flag", 0), "flag"),
                )
            )
        self._change(task, request, site)

    def _change(self, task: int, request: Message, site: str | None) -> None:
        """A change of a task: its model waits for aclmdlRIUpdate, or is faulted when the
        daemon refused the change with 107000 (as the daemon's model is)."""
        try:
            self._calls.request(request, site)
        except NpuError as error:
            if error.code == codes.ACL_ERROR_RT_PARAM_INVALID:
                self._graphs.tasks_changed(task, failed=True)
            raise
        self._graphs.tasks_changed(task, failed=False)

    @records_errors
    def task_disable(self, task: int, site: str | None = None) -> None:
        """aclmdlRITaskDisable: the task no longer runs in replays (after aclmdlRIUpdate).
        107040 while the model is captured or runs."""
        if not task:
            raise _runtime_null("task")
        self._change(task, pb.TaskDisableRequest(task=task), site)

    @records_errors
    def model_update(self, model: int, site: str | None = None) -> None:
        """aclmdlRIUpdate: the model's changed tasks take effect; 107040 if it is captured or
        a change failed."""
        if not model:
            raise _runtime_null("modelRI")
        self._calls.request(pb.ModelUpdateRequest(model=model), site)
        self._graphs.updated(model)

    @records_errors
    def kernel_task_get_attribute(self, task: int, attr: int, site: str | None = None) -> dict:
        """aclmdlRIKernelTaskGetAttribute: {field: value} of aclrtLaunchKernelAttrValue.
        107000 for a task that is not a kernel or an attribute it cannot give."""
        if not task:
            raise _null("task")
        request = pb.KernelTaskAttributeRequest(task=task, attr=attr)
        value = self._calls.request(request, site).value
        if attr == codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US:
            return {"timeout_us": {"timeout_low": value & 0xFFFFFFFF, "timeout_high": value >> 32}}
        return {_ATTRIBUTE_FIELDS[attr]: value}


def _int(value: Any, name: str) -> int:
    if not isinstance(value, int) or value < 0:
        raise invalid(f"params {name} must be a non-negative int, not {value!r}")
    return value


def _kernel_params(kernel: Any) -> pb.KernelTaskParams:
    """The wire form of aclmdlRIKernelTaskParams: host arguments are copied now."""
    if not isinstance(kernel, dict):
        raise invalid("params must have a kernel_task_params dict")
    if kernel.get("cfg") not in (None, 0):
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "a launch configuration in kernel_task_params is not simulated (give cfg None)",
        )
    args = _int(kernel.get("args", 0), "args")
    size = _int(kernel.get("args_size", 0), "args_size")
    params = pb.KernelTaskParams(
        function=_int(kernel.get("func_handle", 0), "func_handle"),
        num_blocks=min(_int(kernel.get("num_blocks", 0), "num_blocks"), 0xFFFFFFFF),
        args_size=size,
    )
    if not args:  # the daemon names what is missing
        return params
    if not size:
        params.args_ptr = args
        return params
    if _int(kernel.get("is_host_args", 0), "is_host_args"):
        if args >= DEVICE_BASE:
            raise invalid("is_host_args is 1 but args is a device address")
        params.args = ctypes.string_at(args, size)
    else:
        params.args_ptr = args
    return params
