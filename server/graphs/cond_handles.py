"""Conditional tasks of captured models (aclmdlRICondHandleCreate, aclmdlRIAddCondTask): the
condition handles and the sub models a cond task chooses among (docs/graph-capture.md,
"Conditional tasks"), with the checks of aclmdlRICondHandleCreate and aclmdlRIAddCondTask
(the runtime's `ApiErrorDecorator` and `ApiImpl::ModelCondHandleCreate`,
`StreamAddCondTaskParasCheck`, `CheckCondTaskParamsSize`), in its order. The task itself is
server/graphs/cond_task.py, the calls server/control/handlers/cond_task_calls.py.

A condition is a uint64 in the client's device memory, allocated with the handle and freed
with the model that made it. A cond task made with a handle gets `size` new, empty sub models
(`Graph`s with `cond` set), which the client fills by capturing into them while the parent's
capture is open; the parent's capture ends only when every sub model (at any depth) has
ended its capture. Everything here but `new_condition` runs under the scheduler lock.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.core.tasks import HostCallbackTask
from simnpu.server.graphs.capture import capture_of
from simnpu.server.graphs.cond_task import CondTask

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.unit_protocol import Span
    from simnpu.server.graphs.capture import Graph
    from simnpu.server.memory.client_memory import ClientMemory
    from simnpu.server.memory.device_memory import DeviceWithMemory

VALUE = struct.Struct("<Q")  # the condition: a uint64
MAX_BRANCHES = 4096  # sub models of one cond task (the runtime has no limit of its own)
_SIZES = {  # aclmdlRICondTaskType -> (the sizes it takes, as the runtime says them)
    codes.ACL_MODEL_RI_COND_TYPE_IF: (lambda size: size in (1, 2), "1 or 2"),
    codes.ACL_MODEL_RI_COND_TYPE_WHILE: (lambda size: size == 1, "1"),
    codes.ACL_MODEL_RI_COND_TYPE_SWITCH: (lambda size: size > 0, "greater than 0"),
}
_NAMES = {
    codes.ACL_MODEL_RI_COND_TYPE_IF: "IF",
    codes.ACL_MODEL_RI_COND_TYPE_WHILE: "WHILE",
    codes.ACL_MODEL_RI_COND_TYPE_SWITCH: "SWITCH",
}


@dataclass(eq=False)
class CondHandle:
    """aclmdlRICondHandle: a condition of `graph` (made while it was being captured), its
    value at `address`, and -- once a cond task uses it -- that task's type and sub models."""

    handle: int
    graph: Graph
    default: int  # defaultLaunchValue
    flag: int  # aclmdlRICondHandleFlag
    address: int  # of the uint64 condition, in the client's device memory
    span: Span
    type: int = -1  # aclmdlRICondTaskType, once used
    subs: list[Graph] = field(default_factory=list)  # the cond task's sub models

    @property
    def name(self) -> str:
        return _NAMES.get(self.type, "?")

    def read(self, scheduler: Scheduler) -> int:
        """The condition's value now."""
        region = scheduler.devices[self.span.device].region
        return int(VALUE.unpack_from(region.map, self.span.offset)[0])

    def choose(self, value: int) -> Graph | None:
        """The sub model a cond task runs for `value` (None: none runs). IF: [0] when the
        value is not 0, else [1] if there is one; WHILE: [0] while it is not 0; SWITCH:
        [value], none when it is out of range (the runtime skips to the next task)."""
        if self.type == codes.ACL_MODEL_RI_COND_TYPE_SWITCH:
            return self.subs[value] if value < len(self.subs) else None
        if value:
            return self.subs[0]
        if self.type == codes.ACL_MODEL_RI_COND_TYPE_IF and len(self.subs) == 2:
            return self.subs[1]
        return None


def new_condition(
    graph: Graph, flag: int, default: int, memory: ClientMemory, device: DeviceWithMemory
) -> CondHandle:
    """aclmdlRICondHandleCreate: a condition of `graph`, 0 at first, a uint64 of the client's
    memory on `device` (the model's) that the model owns. 107000 for a flag other than 0 or
    ASSIGN_DEFAULT or a model not being captured (or whose capture was invalidated); 207000
    for a built model (not a captured one)."""
    if flag > codes.ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT:
        raise invalid(f"flag {flag}: use 0 or ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT")
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
    address = memory.allocate(device, VALUE.size, codes.ACL_MEM_MALLOC_HUGE_FIRST)
    span = memory.span(address)
    VALUE.pack_into(device.region.map, span.offset, 0)
    cond = CondHandle(0, graph, default, flag, address, span)
    graph.conds.append(cond)
    return cond


def check_cond_type(kind: int) -> None:
    """107000 for a type that is no aclmdlRICondTaskType."""
    if kind not in _SIZES:
        raise invalid(f"type {kind}: use an aclmdlRICondTaskType")


def add_cond_task(
    scheduler: Scheduler,
    stream: Stream,
    seq: int,
    cond: CondHandle,
    kind: int,
    size: int,
    new_sub_model: Callable[[], Graph],
) -> list[Graph]:
    """aclmdlRIAddCondTask (under the scheduler, in order with the tasks submitted before it,
    as any recorded task is): a cond task of `kind` with `cond` recorded on the capturing
    stream, and its `size` new sub models (`new_sub_model`), which are returned. 107000 for
    a condition used already, a stream captured into another model than the condition's,
    or a size its type does not take; 107029 for a stream not in capture."""
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
    takes, sizes = _SIZES[kind]
    if not takes(size):
        raise invalid(f"size {size}: this cond task type takes {sizes}")
    if size > MAX_BRANCHES:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            f"size {size}: a cond task of more than {MAX_BRANCHES} sub models is not simulated",
        )
    cond.type = kind
    for _ in range(size):
        cond.subs.append(new_sub_model())
    scheduler.submit(CondTask(seq, stream, cond))
    return cond.subs


def sub_models(graph: Graph) -> Iterator[Graph]:
    """The sub models of `graph`'s cond tasks, at every depth."""
    for cond in graph.conds:
        for sub in cond.subs:
            yield sub
            yield from sub_models(sub)


def assign_defaults(scheduler: Scheduler, graph: Graph) -> None:
    """A replay of `graph` starts (aclmdlRIExecuteAsync, aclmdlRIExecute): as the runtime
    does at the call (`InitAllSubCaptureModelCondTaskByDefValue`), each condition used by a
    cond task of it or of its sub models, made with ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT,
    is set to its default value -- so a value the client wrote before the call is lost."""
    for model in (graph, *sub_models(graph)):
        for cond in model.conds:
            if cond.subs and cond.flag == codes.ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT:
                region = scheduler.devices[cond.span.device].region
                VALUE.pack_into(region.map, cond.span.offset, cond.default)


def capture_refused(graph: Graph, first: int) -> tuple[int, str] | None:
    """Why the capture of `graph` that recorded its tasks from `first` on cannot end, if it
    cannot: a sub model still being captured or never captured (107045, the runtime's
    `CheckSubModelsIsEndCapture`), or a host callback recorded into a sub model (not
    simulated: each replay runs a sub model any number of times, which the client's count of
    callbacks to expect cannot follow)."""
    for sub in sub_models(graph):
        if sub.capture is not None or not sub.lanes:
            return (
                codes.ACL_ERROR_RT_SUB_ACLGRAPH_IS_CAPTURING,
                f"sub model {sub.id} of a cond task has not ended its capture "
                "(aclmdlRICaptureToModelRIBegin .. aclmdlRICaptureEnd it first)",
            )
    if graph.cond is not None and any(
        isinstance(task, HostCallbackTask) for _, task in graph.order[first:]
    ):
        return (
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "host callbacks in the sub models of cond tasks are not simulated",
        )
    return None


def not_sub_model(graph: Graph, what: str) -> None:
    """207000 for a sub model of a cond task: it runs, and goes, only with its model."""
    if graph.cond is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            f"model {graph.id} is a sub model of a cond task: it is not {what} on its own "
            "(only with the model of its cond task)",
        )


def release(memory: ClientMemory, graph: Graph) -> list[Graph]:
    """`graph` is gone: its conditions' memory goes with it (their handles too: the caller's),
    and the captures still open into the sub models of its cond tasks end; those sub models
    are returned (the caller releases them too)."""
    subs = []
    for cond in graph.conds:
        if cond.address in memory.allocations:  # (unless the client freed it)
            memory.free(cond.address)
        for sub in cond.subs:
            if sub.capture is not None:
                sub.capture.end(keep=False)
        subs += cond.subs
    graph.conds = []
    return subs
