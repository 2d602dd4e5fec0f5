"""Task groups and updates of captured graphs, without recapture (docs/graph-capture.md,
"Updates"): aclmdlRICaptureTaskGrpBegin / End mark recorded kernels as a group;
aclmdlRICaptureTaskUpdateBegin / End turn the kernels launched on another stream into
updates of that group's kernels, applied when that stream reaches them (the marks, with the
runtime's checks and codes, see a stream's recorders: server/graphs/stream_recorders.py).
aclmdlRITaskSetParams, aclmdlRITaskDisable and aclmdlRIUpdate change a model that does not run
(server/graphs/task_changes.py).

Everything here runs under the scheduler lock.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.server.core.tasks.base import Task
from simnpu.server.core.tasks.kernel import KernelTask
from simnpu.server.graphs.task_update_task import TaskUpdateTask

if TYPE_CHECKING:
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.core.streams import Stream
    from simnpu.server.graphs.capture import Capture, Graph


class UpdateStatus(enum.IntEnum):
    """What a model's task changes left it in (the runtime's RtCaptureModelStatus)."""

    READY = 0  # replays may run
    UPDATING = 1  # tasks were changed: aclmdlRIUpdate before the next replay
    FAULT = 2  # a change failed: the model neither replays nor updates any more


class TaskGroup:
    """aclrtTaskGrp: the kernels one capturing stream recorded between
    aclmdlRICaptureTaskGrpBegin and aclmdlRICaptureTaskGrpEnd, in order. The recorder of the
    stream that updates it (server/core/recorder.py, server/graphs/stream_recorders.py)."""

    refuses_synchronize = False  # the stream runs its tasks: a synchronize waits for them

    def __init__(self, graph: Graph, stream: Stream):
        self.graph = graph
        self.stream = stream  # the capturing stream it was begun on
        self.tasks: list[KernelTask] = []
        self.handle = 0  # its handle once ended
        self.updater: Stream | None = None  # the stream updating it now
        self.next = 0  # while updated: the position of the next kernel to replace

    def take(self, task: Task, scheduler: Scheduler, submitted: bool = False) -> Task:
        """A task submitted to the stream updating this group runs as `update` makes it."""
        return self.update(task)

    def followed(self, task: Task) -> None:
        """A wait on an event recorded on the updating stream pulls nothing in."""

    def update(self, launch: Task) -> Task:
        """`launch`, submitted to the stream updating this group: a kernel becomes the update
        of the group's next kernel (TaskUpdateTask); other tasks run as they are."""
        if not isinstance(launch, KernelTask):
            return launch
        index = self.next
        if index < len(self.tasks):
            self.next += 1
        return TaskUpdateTask(launch.seq, launch.stream, self, index, launch)


def admitted(capture: Capture, task: Task) -> bool:
    """Whether `task`, submitted to a stream of `capture` while it has task groups open, is
    recorded: into its stream's group when a kernel; refused with the groups' error set
    otherwise (507009 another task kind in a group, 107034 a task of a stream without a group,
    as the runtime's task group packing and interruption checks)."""
    group = capture.groups.get(task.stream)
    if group is None:
        capture.group_error = capture.group_error or (
            codes.ACL_ERROR_STREAM_TASK_GROUP_INTR,
            f"task {task.seq} ({task.kind}) was submitted to a stream of the capture without "
            "a task group while another stream's task group was open",
        )
        return False
    if not isinstance(task, KernelTask):
        capture.group_error = capture.group_error or (
            codes.ACL_ERROR_RT_TASK_TYPE_NOT_SUPPORT,
            f"task {task.seq} ({task.kind}) cannot be in a task group: only kernels can",
        )
        return False
    group.tasks.append(task)
    return True


def updatable(graph: Graph) -> set[Task]:
    """The recorded tasks of `graph` an update may replace while it replays."""
    return {task for group in graph.groups for task in group.tasks}
