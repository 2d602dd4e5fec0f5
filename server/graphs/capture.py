"""Graph capture and replay (aclmdlRI): the capture state of streams, the recorded graph of a
model run instance, and what a replay of it submits (docs/graph-capture.md).

A capture is the recorder of the streams in it (`Stream.recorder`, server/core/recorder.py):
`Scheduler.submit` hands their tasks to `Capture.take`, which records them instead of
queueing them, so every task kind is recorded the same way. A wait on an event recorded in
a capture pulls its stream into that capture (`Capture.followed`, from
`WaitTask.submitted`). A capture holds its streams above the recorders they had (a model
they are bound to, a task group they update), which they get back when it ends. Everything
here runs under the scheduler lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.core.scheduler import drained
from simnpu.server.core.streams import Stream
from simnpu.server.core.tasks import RecordTask, Task, WaitTask
from simnpu.server.graphs.task_groups import TaskGroup, UpdateStatus, admitted

if TYPE_CHECKING:
    from simnpu.server.core.recorder import Recorder
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Context, Event
    from simnpu.server.graphs.cond_handles import CondHandle
    from simnpu.server.graphs.model_build import Build
    from simnpu.server.graphs.replay_task import ReplayTask

# aclmdlRITaskType of the recorded task kinds (others: ACL_MODEL_RI_TASK_DEFAULT)
TASK_TYPES = {
    "kernel": codes.ACL_MODEL_RI_TASK_KERNEL,
    "record": codes.ACL_MODEL_RI_TASK_EVENT_RECORD,
    "wait": codes.ACL_MODEL_RI_TASK_EVENT_WAIT,
    "reset": codes.ACL_MODEL_RI_TASK_EVENT_RESET,
    "value_write": codes.ACL_MODEL_RI_TASK_VALUE_WRITE,
    "value_wait": codes.ACL_MODEL_RI_TASK_VALUE_WAIT,
}


@dataclass(eq=False)
class Lane:
    """One captured stream of a graph: its recorded tasks in stream order. `handle` is what
    aclmdlRIGetStreams returns for it."""

    handle: int
    tasks: list[Task] = field(default_factory=list)
    task_handles: list[int] = field(default_factory=list)  # of its first tasks, once listed


@dataclass(eq=False)
class Graph:
    """A model run instance: its lanes (the origin's first), every recorded task in capture
    order with its lane, and the replays of it running now."""

    handle: int
    id: int
    context: Context  # where its replays by aclmdlRIExecute run
    name: str = ""
    lanes: list[Lane] = field(default_factory=list)
    order: list[tuple[Lane, Task]] = field(default_factory=list)
    capture: Capture | None = None  # the capture recording into it now
    running: set[ReplayTask] = field(default_factory=set)
    build: Build | None = None  # made by aclmdlRIBuildBegin (server/graphs/model_build.py)
    # task groups and changes of its tasks (server/graphs/task_groups.py)
    groups: list[TaskGroup] = field(default_factory=list)
    disabled: set[Task] = field(default_factory=set)  # aclmdlRITaskDisable
    status: UpdateStatus = UpdateStatus.READY
    # conditional tasks (server/graphs/cond_handles.py): the conditions made on it and, for a sub
    # model of a cond task, that task's condition
    conds: list[CondHandle] = field(default_factory=list)
    cond: CondHandle | None = None


class Capture:
    """A capture in progress into `graph`, begun on `origin` in `mode`: the recorder of the
    streams in it (server/core/recorder.py)."""

    refuses_synchronize = True  # a synchronize of a stream in capture is refused (107027)

    def __init__(self, graph: Graph, origin: Stream, mode: int, new_lane: Callable[[Stream], Lane]):
        self.graph = graph
        self.origin = origin
        self.mode = mode
        self.new_lane = new_lane  # (stream) -> a new Lane with its handle
        self.lanes: dict[Stream, Lane] = {}
        self.invalid: str | None = None  # why the capture was invalidated
        self.restore: dict[Event, RecordTask | None] = {}  # event -> its record before
        self.first = len(graph.order)  # where this capture's tasks begin (appending to a model)
        self.groups: dict[Stream, TaskGroup] = {}  # task groups open now, by stream
        self.group_error: tuple[int, str] | None = None  # what their ends report
        self.below: dict[Stream, Recorder | None] = {}  # each stream's recorder before it
        graph.capture = self
        self.join(origin)

    def join(self, stream: Stream) -> None:
        """`stream` records into this capture from now on (the origin, or a fork)."""
        if stream not in self.lanes:
            self.below[stream] = stream.recorder
            lane = self.new_lane(stream)
            self.lanes[stream] = lane
            self.graph.lanes.append(lane)
        stream.recorder = self

    def take(self, task: Task, scheduler: Scheduler, submitted: bool = False) -> None:
        """A task submitted to a stream in this capture is recorded (`record`), not run."""
        for subscriber in scheduler.subscribers:  # (a checked client's call site stays with it)
            subscriber.captured(task)
        self.record(task, submitted)

    def followed(self, task: Task) -> None:
        """A wait on an event recorded in this capture pulls its stream in (a fork), unless
        the stream is in a capture already (this one, or another: `record` refuses it)."""
        if not isinstance(task.stream.recorder, Capture):
            self.join(task.stream)

    def record(self, task: Task, submitted: bool = False) -> None:
        """`task` of a stream in this capture is recorded, not run; a kind that cannot be
        replayed invalidates the capture."""
        stream = task.stream
        stream.recorded_upto = task.seq
        if not stream.tasks and stream.signal is not None:  # a synchronize asks the daemon
            stream.signal.publish(task.seq, True)
        if not task.capturable:  # (not even submitted: it must leave no trace)
            self.invalidate(f"task {task.seq} ({task.kind}) cannot be captured")
            return
        if self.groups and not admitted(self, task):  # (not submitted either)
            return
        if not submitted:
            if type(task) is RecordTask:
                self.restore.setdefault(task.event, task.event.latest_record)
            task.submitted()
        if self.invalid is not None:
            return
        if type(task) is WaitTask and task.record is not None:
            other = capture_of(task.record.stream)
            if other is not None and other is not self:
                self.invalid = f"task {task.seq} waits for an event recorded in another capture"
                return
        lane = self.lanes[stream]
        lane.tasks.append(task)
        self.graph.order.append((lane, task))

    def invalidate(self, why: str) -> None:
        if self.invalid is None:
            self.invalid = why

    def unjoined(self) -> list[Lane]:
        """The lanes of forked streams whose last task is not waited for, directly or through
        other lanes, by the origin stream (they must be joined before the capture ends)."""
        origin = self.lanes[self.origin]
        joined = {origin}
        pending = [lane for lane in self.lanes.values() if lane is not origin]
        progress = True
        while pending and progress:
            progress = False
            for lane in list(pending):
                last = lane.tasks[-1] if lane.tasks else None
                if last is None or any(
                    type(task) is WaitTask and task.record is last
                    for other in joined
                    for task in other.tasks
                ):
                    joined.add(lane)
                    pending.remove(lane)
                    progress = True
        return pending

    def end(self, keep: bool) -> None:
        """The capture is over: its streams run again, the events it recorded get back their
        records from before; `keep` False drops what it recorded into the graph."""
        for event, record in self.restore.items():
            event.latest_record = record
        for stream in self.lanes:
            stream.recorder = self.below[stream]
            if not stream.tasks:
                drained(stream, stream.recorded_upto)
        graph = self.graph
        graph.capture = None
        if not keep:
            for _, task in graph.order[self.first :]:
                task.forgotten()
            del graph.order[self.first :]
            lanes = set(self.lanes.values())
            graph.lanes = [lane for lane in graph.lanes if lane not in lanes]


def capture_of(stream: Stream) -> Capture | None:
    """The capture `stream` is in, if any (a capture holds its streams above any other
    recorder)."""
    recorder = stream.recorder
    return recorder if isinstance(recorder, Capture) else None


def invalidate_capture(stream: Stream, why: str) -> None:
    """A call on `stream` was refused: the capture recording it, if any, is invalidated."""
    capture = capture_of(stream)
    if capture is not None:
        capture.invalidate(why)


def not_in_capture(streams: list[Stream], call: str) -> None:
    """107027 if one of `streams` is being captured: `call` is refused in every mode."""
    if any(capture_of(stream) is not None for stream in streams):
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_CAPTURED,
            f"{call} is refused while a stream is being captured (aclmdlRICaptureEnd first)",
        )
