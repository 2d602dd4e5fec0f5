"""Conditional tasks of captured models (aclmdlRICondHandleCreate, aclmdlRIAddCondTask): the
condition handles and the sub models a cond task chooses among (docs/graph-capture.md,
"Conditional tasks"). The task itself is server/graphs/cond_task.py, the calls
server/control/handlers/cond_tasks.py.

A condition is a uint64 in the client's device memory, allocated with the handle and freed
with the model that made it. A cond task made with a handle gets `size` new, empty sub models
(`Graph`s with `cond` set), which the client fills by capturing into them while the parent's
capture is open; the parent's capture ends only when every sub model (at any depth) has
ended its capture. Everything here runs under the scheduler lock.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.core.tasks import HostCallbackTask

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.tasks.base import OwnMemory
    from simnpu.server.core.unit_protocol import Span
    from simnpu.server.graphs.capture import Graph

VALUE = struct.Struct("<Q")  # the condition: a uint64
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


def release(graph: Graph, forget: Callable[[int], object], memory: OwnMemory) -> list[Graph]:
    """`graph` is gone: its conditions' handles (`forget` removes one) and memory (the
    client's `memory`) go with it, and the captures still open into the sub models of its
    cond tasks end; those sub models are returned (the caller forgets them too)."""
    subs = []
    for cond in graph.conds:
        forget(cond.handle)
        if cond.address in memory.allocations:  # (unless the client freed it)
            memory.free(cond.address)
        for sub in cond.subs:
            if sub.capture is not None:
                sub.capture.end(keep=False)
        subs += cond.subs
    graph.conds = []
    return subs
