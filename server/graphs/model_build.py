"""Explicitly built models (aclmdlRIBuildBegin .. aclmdlRIBuildEnd): streams bound to a model
record their tasks into it, and the labels its control-flow tasks jump to
(docs/model-build.md).

A model being built is the recorder of its bound streams (`Stream.recorder`,
server/core/recorder.py): `Scheduler.submit` hands their tasks to `Build.take`, which appends
them to the stream's lane of the model's `Graph` -- the same graph a capture makes, replayed
by the same `ReplayTask`. Unlike a capture, a bound stream's tasks are not
`submitted()` when recorded (only their replicas are, at each replay), so an event recorded
on a bound stream is never waited for outside the model. The checks of the calls
(aclmdlRIBindStream, aclmdlRIEndTask, aclmdlRIBuildEnd, aclrtActiveStream, aclrtSwitchStream,
the labels') are here, with the runtime's codes; their handlers are
server/control/handlers/model_build_calls.py. Binding, unbinding and the end of a build run
under the scheduler lock, in order with the commands before them: a task sent before
aclmdlRIBindStream runs, one sent after is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.core.scheduler import drained
from simnpu.server.graphs.capture import capture_of
from simnpu.server.graphs.flow_tasks import LabelTask, SwitchLabelTask, value_size

if TYPE_CHECKING:
    from simnpu.server.core.recorder import Recorder
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.tasks import Task
    from simnpu.server.graphs.capture import Graph, Lane

_CONDITIONS = range(codes.ACL_RT_EQUAL, codes.ACL_RT_LESS_OR_EQUAL + 1)
_DATA_TYPES = (codes.ACL_RT_SWITCH_INT32, codes.ACL_RT_SWITCH_INT64)


@dataclass(eq=False)
class Label:
    """aclrtCreateLabel: set once on a bound stream (`lane`), the place a jump goes to."""

    handle: int
    lane: Lane | None = None  # where aclrtSetLabel put it
    marker: Task | None = None  # its place: the label task on that lane


@dataclass(eq=False)
class LabelList:
    """aclrtCreateLabelList: the labels aclrtSwitchLabelByIndex chooses among, in order."""

    handle: int
    labels: list[Label]


@dataclass(eq=False)
class Build:
    """The building state of a model made by aclmdlRIBuildBegin: its bound streams and which
    of them start a replay (the heads); the others wait to be activated. The recorder of its
    bound streams (server/core/recorder.py)."""

    graph: Graph
    lanes: dict[Stream, Lane] = field(default_factory=dict)
    heads: set[Lane] = field(default_factory=set)
    ended: bool = False  # aclmdlRIBuildEnd
    refused: str | None = None  # a task kind that cannot be replayed was submitted
    # each bound stream's recorder below this one: a task group it updates (which takes
    # none of its tasks while it is bound), None
    below: dict[Stream, Recorder | None] = field(default_factory=dict)
    refuses_synchronize = False  # a synchronize of a bound stream returns at once

    def bind(self, stream: Stream, lane: Lane, head: bool) -> None:
        self.below[stream] = stream.recorder
        stream.recorder = self
        self.lanes[stream] = lane
        self.graph.lanes.append(lane)
        if head:
            self.heads.add(lane)

    def unbind(self, stream: Stream) -> None:
        """The stream runs its tasks again; what it recorded stays in the model."""
        stream.recorder = self.below.pop(stream)
        del self.lanes[stream]

    def take(self, task: Task, scheduler: Scheduler, submitted: bool = False) -> None:
        """A task submitted to a bound stream is recorded (`record`), not run."""
        self.record(task)

    def followed(self, task: Task) -> None:
        """A wait on an event recorded on a bound stream pulls nothing into the model."""

    def record(self, task: Task) -> None:
        """`task` of a bound stream is recorded into its lane, not run."""
        stream = task.stream
        stream.recorded_upto = task.seq
        if not task.capturable:
            if self.refused is None:
                self.refused = f"task {task.seq} ({task.kind}) cannot be part of a model"
        else:
            lane = self.lanes[stream]
            lane.tasks.append(task)
            self.graph.order.append((lane, task))
        if not stream.tasks:  # a synchronize of a persistent stream returns at once
            drained(stream, task.seq)


# ---- the calls' checks --------------------------------------------------------------------------
def built(graph: Graph) -> Build:
    """The building state of model `graph`; 107000 for a captured model."""
    if graph.build is None:
        raise invalid(
            f"model {graph.id} was captured (aclmdlRICaptureBegin): only a model of "
            "aclmdlRIBuildBegin has bound streams"
        )
    return graph.build


def bound_to(stream: Stream) -> Build | None:
    """The model `stream` is bound to (aclmdlRIBindStream), if any: its recorder, or the one
    the capture it is in holds it above (server/graphs/stream_recorders.py)."""
    capture = capture_of(stream)
    recorder = stream.recorder if capture is None else capture.below.get(stream)
    return recorder if isinstance(recorder, Build) else None


def bound(stream: Stream, build: Build | None = None) -> Build:
    """The model `stream` is bound to (`build` when given); else 107005."""
    current = bound_to(stream)
    if current is None or (build is not None and current is not build):
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_MODEL,
            "the stream is not bound to the model (aclmdlRIBindStream it first)"
            if build is not None
            else "the stream is not bound to a model (aclmdlRIBindStream it first)",
        )
    return current


def not_capturing(stream: Stream) -> None:
    """107027 for a stream in capture."""
    if capture_of(stream) is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_CAPTURED,
            "the stream is being captured (aclmdlRICaptureEnd it first)",
        )


def check_build_flag(flag: int) -> None:
    """aclmdlRIBuildBegin: 107000 for a flag other than 0 (reserved)."""
    if flag:
        raise invalid(f"flag {flag}: it is reserved and must be 0")


def bind(build: Build, stream: Stream, flag: int, new_lane: Callable[[], Lane]) -> None:
    """aclmdlRIBindStream: `stream` records into the model from now on, on a new lane (a head
    with ACL_MODEL_STREAM_FLAG_HEAD). 107027 a stream in capture, 207000 a stream with
    ACL_STREAM_FAST_LAUNCH, 107000 one without ACL_STREAM_PERSISTENT, 107005 a stream bound
    already, 107004 a stream of another context."""
    not_capturing(stream)
    if stream.flags & codes.ACL_STREAM_FAST_LAUNCH:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "a stream with ACL_STREAM_FAST_LAUNCH cannot be bound to a model",
        )
    if not stream.flags & codes.ACL_STREAM_PERSISTENT:
        raise invalid(
            "only a persistent stream (aclrtCreateStreamWithConfig with "
            "ACL_STREAM_PERSISTENT) can be bound to a model"
        )
    current = bound_to(stream)
    if current is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_MODEL,
            f"the stream is bound to model {current.graph.id} already",
        )
    if stream.context is not build.graph.context:
        raise NpuError(
            codes.ACL_ERROR_RT_MODEL_CONTEXT,
            "the stream is of another context than the model",
        )
    build.bind(stream, new_lane(), head=flag == codes.ACL_MODEL_STREAM_FLAG_HEAD)


def unbind(build: Build, stream: Stream) -> None:
    """aclmdlRIUnbindStream: 107027 a stream in capture, 107005 one not bound to the model."""
    not_capturing(stream)
    bound(stream, build).unbind(stream)


def end(build: Build) -> list[Task]:
    """aclmdlRIBuildEnd: the model may be replayed; its recorded tasks. 107000 if a bound
    stream got a task that cannot be part of a model; 207000 if a label jump goes backwards
    or to another stream (not simulated)."""
    why = build.refused or _backward_jump(build)
    if why is not None:
        code = codes.ACL_ERROR_RT_PARAM_INVALID
        if build.refused is None:
            code = codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT
        raise NpuError(code, why)
    build.ended = True
    return [task for _, task in build.graph.order]


def _backward_jump(build: Build) -> str | None:
    """Why a label switch of the model cannot be simulated, if one cannot: each of its
    labels must be set after it on its own stream (a forward jump)."""
    for lane in build.graph.lanes:
        for position, task in enumerate(lane.tasks):
            if not isinstance(task, SwitchLabelTask):
                continue
            for label in task.labels[: task.max_value]:
                marker = label.marker
                if label.lane is not lane or marker is None or lane.tasks.index(marker) < position:
                    return (
                        f"task {task.seq} jumps to a label that is not set after it on its "
                        "stream: only forward jumps within a stream are simulated"
                    )
    return None


def switch_value_size(condition: int, data_type: int) -> int:
    """aclrtSwitchStream: the bytes of each value it compares; 107000 for an unknown
    condition or data type."""
    if condition not in _CONDITIONS:
        raise invalid(f"condition {condition}: use an aclrtCondition")
    if data_type not in _DATA_TYPES:
        raise invalid(f"dataType {data_type}: use an aclrtCompareDataType")
    return value_size(data_type)


def set_label(seq: int, stream: Stream, label: Label) -> LabelTask:
    """aclrtSetLabel: the task that marks the next place of a bound stream with `label`
    (107005 for a stream not bound to a model, 107000 for a label set already)."""
    build = bound(stream)
    if label.lane is not None:
        raise invalid("the label is set already (a label marks one place)")
    task = LabelTask(seq, stream, label)
    label.lane, label.marker = build.lanes[stream], task
    return task
