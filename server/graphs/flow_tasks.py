"""Control-flow tasks of explicitly built models (docs/model-build.md): the end of the graph
(aclmdlRIEndTask), starting another stream of the model (aclrtActiveStream,
aclrtSwitchStream) and jumping to a label (aclrtSetLabel, aclrtSwitchLabelByIndex).

They exist only in a model's lanes (their calls refuse a stream not bound to a model) and
run only as a replay's replicas, which the replay gives itself (`replay`): a stream is
started through it, and a jump drops the tasks of the replica's own stream up to the label.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.core.tasks.base import Task

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.core.unit_protocol import Span
    from simnpu.server.graphs.capture import Lane
    from simnpu.server.graphs.model_build import Label
    from simnpu.server.graphs.replay_task import ReplayTask

_VALUES = {
    codes.ACL_RT_SWITCH_INT32: struct.Struct("<i"),
    codes.ACL_RT_SWITCH_INT64: struct.Struct("<q"),
}
_CONDITIONS = {
    codes.ACL_RT_EQUAL: lambda a, b: a == b,
    codes.ACL_RT_NOT_EQUAL: lambda a, b: a != b,
    codes.ACL_RT_GREATER: lambda a, b: a > b,
    codes.ACL_RT_GREATER_OR_EQUAL: lambda a, b: a >= b,
    codes.ACL_RT_LESS: lambda a, b: a < b,
    codes.ACL_RT_LESS_OR_EQUAL: lambda a, b: a <= b,
}
_INDEX = struct.Struct("<I")


def value_size(data_type: int) -> int:
    """The bytes aclrtSwitchStream reads per value of an aclrtCompareDataType."""
    return _VALUES[data_type].size


def _read(scheduler: Scheduler, span: Span, layout: struct.Struct) -> int:
    return int(layout.unpack_from(scheduler.devices[span.device].region.map, span.offset)[0])


class FlowTask(Task):
    """A task of a model's control flow; `replay` is the replay its replica belongs to."""

    __slots__ = ("replay",)

    def __init__(self, seq: int, stream: Stream):
        super().__init__(seq, stream)
        self.replay: ReplayTask | None = None


class EndGraphTask(FlowTask):
    """aclmdlRIEndTask: the model's end on its stream (the replay ends when every started
    stream has run out)."""

    __slots__ = ()
    kind = "end_graph"

    def start(self, scheduler: Scheduler) -> bool:
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "end of graph", "model", {}


class ActivateTask(FlowTask):
    """aclrtActiveStream: start `target`, a stream of the same model."""

    __slots__ = ("target",)
    kind = "active_stream"

    def __init__(self, seq: int, stream: Stream, target: Lane):
        super().__init__(seq, stream)
        self.target = target

    def start(self, scheduler: Scheduler) -> bool:
        if self.replay is not None:
            self.replay.activate(self.target, scheduler)
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "activate stream", "model", {"stream": self.target.handle & 0xFFFFFFFF}


class SwitchStreamTask(ActivateTask):
    """aclrtSwitchStream: start `target` when `left <condition> right` holds, both read as
    `data_type` when the task runs."""

    __slots__ = ("condition", "data_type", "left", "right")
    kind = "switch_stream"

    def __init__(
        self,
        seq: int,
        stream: Stream,
        target: Lane,
        left: Span,
        right: Span,
        condition: int,
        data_type: int,
    ):
        super().__init__(seq, stream, target)
        self.left, self.right = left, right
        self.condition, self.data_type = condition, data_type

    def start(self, scheduler: Scheduler) -> bool:
        layout = _VALUES[self.data_type]
        left, right = _read(scheduler, self.left, layout), _read(scheduler, self.right, layout)
        if _CONDITIONS[self.condition](left, right):
            return super().start(scheduler)
        return True

    def describe(self) -> tuple[str, str, dict]:
        name, category, args = super().describe()
        return "switch stream", category, {**args, "condition": self.condition}


class LabelTask(FlowTask):
    """aclrtSetLabel: the place of `label` in its stream (does nothing when reached)."""

    __slots__ = ("label",)
    kind = "label"

    def __init__(self, seq: int, stream: Stream, label: Label):
        super().__init__(seq, stream)
        self.label = label

    def start(self, scheduler: Scheduler) -> bool:
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "label", "model", {}


class SwitchLabelTask(FlowTask):
    """aclrtSwitchLabelByIndex: jump to labels[index], the uint32 at `index` read when the
    task runs (an index past `max_value` - 1 jumps to the last label within max_value): the
    stream's tasks before that label are dropped. Its labels follow it on its stream (checked
    by aclmdlRIBuildEnd)."""

    __slots__ = ("index", "labels", "max_value")
    kind = "switch_label"

    def __init__(self, seq: int, stream: Stream, index: Span, max_value: int, labels: list[Label]):
        super().__init__(seq, stream)
        self.index, self.max_value, self.labels = index, max_value, labels

    def start(self, scheduler: Scheduler) -> bool:
        index = min(_read(scheduler, self.index, _INDEX), self.max_value - 1, len(self.labels) - 1)
        target = self.labels[index]
        tasks = self.stream.tasks
        skipped = []
        for task in list(tasks)[1:]:
            if isinstance(task, LabelTask) and task.label is target:
                break
            skipped.append(task)
        for task in skipped:
            tasks.remove(task)
            scheduler.discard(task)
        return True

    def describe(self) -> tuple[str, str, dict]:
        return "switch label", "model", {"labels": len(self.labels)}
