"""Explicitly built models (aclmdlRIBuildBegin .. aclmdlRIBuildEnd): streams bound to a model
record their tasks into it, and the labels its control-flow tasks jump to
(docs/model-build.md).

A model being built is the recorder of its bound streams (`Stream.recorder`,
server/core/recorder.py): `Scheduler.submit` hands their tasks to `Build.take`, which appends
them to the stream's lane of the model's `Graph` -- the same graph a capture makes, replayed
by the same `ReplayTask`. Unlike a capture, a bound stream's tasks are not
`submitted()` when recorded (only their replicas are, at each replay), so an event recorded
on a bound stream is never waited for outside the model. Everything here runs under the
scheduler lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.server.core.scheduler import drained

if TYPE_CHECKING:
    from simnpu.server.core.recorder import Recorder
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.tasks import Task
    from simnpu.server.graphs.capture import Graph, Lane


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
