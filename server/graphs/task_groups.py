"""Task groups and updates of captured graphs, without recapture (docs/graph-capture.md,
"Updates"): aclmdlRICaptureTaskGrpBegin / End mark recorded kernels as a group;
aclmdlRICaptureTaskUpdateBegin / End turn the kernels launched on another stream into
updates of that group's kernels, applied when that stream reaches them (the marks: `begin_group`,
`end_group`, `begin_update`, `end_update`, with the runtime's checks and codes).
aclmdlRITaskSetParams, aclmdlRITaskDisable and aclmdlRIUpdate change a model that does not run
(server/graphs/task_changes.py).

Everything here runs under the scheduler lock: the marks in order with the launches around
them, as capture begin and end do.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.core.tasks.base import Task
from simnpu.server.core.tasks.kernel import KernelTask
from simnpu.server.graphs.task_update_task import TaskUpdateTask

if TYPE_CHECKING:
    from simnpu.server.core.objects import Stream
    from simnpu.server.graphs.capture import Capture, Graph


class UpdateStatus(enum.IntEnum):
    """What a model's task changes left it in (the runtime's RtCaptureModelStatus)."""

    READY = 0  # replays may run
    UPDATING = 1  # tasks were changed: aclmdlRIUpdate before the next replay
    FAULT = 2  # a change failed: the model neither replays nor updates any more


class TaskGroup:
    """aclrtTaskGrp: the kernels one capturing stream recorded between
    aclmdlRICaptureTaskGrpBegin and aclmdlRICaptureTaskGrpEnd, in order."""

    def __init__(self, graph: Graph, stream: Stream):
        self.graph = graph
        self.stream = stream  # the capturing stream it was begun on
        self.tasks: list[KernelTask] = []
        self.handle = 0  # its handle once ended
        self.updater: Stream | None = None  # the stream updating it now
        self.next = 0  # while updated: the position of the next kernel to replace

    def update(self, launch: Task) -> Task:
        """`launch`, submitted to the stream updating this group: a kernel becomes the update
        of the group's next kernel (TaskUpdateTask); other tasks run as they are."""
        if not isinstance(launch, KernelTask):
            return launch
        index = self.next
        if index < len(self.tasks):
            self.next += 1
        return TaskUpdateTask(launch.seq, launch.stream, self, index, launch)


def begin_group(stream: Stream) -> None:
    """aclmdlRICaptureTaskGrpBegin: 107029 not in capture, 107033 a group open already or the
    stream updating one."""
    capture = _capture(stream)
    if stream in capture.groups or stream.updating is not None:
        raise NpuError(
            codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
            "a task group is open on this stream already (aclmdlRICaptureTaskGrpEnd it)"
            if stream.updating is None
            else "the stream is updating a task group (aclmdlRICaptureTaskUpdateEnd it)",
        )
    capture.groups[stream] = TaskGroup(capture.graph, stream)


def end_group(stream: Stream) -> TaskGroup:
    """aclmdlRICaptureTaskGrpEnd: the group, now one of its model's (its handle is the
    caller's to give); 107029 not in capture, 107033 none open, the error a task of the group
    met (507009, 107034), or 507903 if the capture was invalidated."""
    capture = _capture(stream)
    group = capture.groups.pop(stream, None)
    if group is None:
        raise NpuError(
            codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
            "no task group is open on this stream (aclmdlRICaptureTaskGrpBegin first)",
        )
    if capture.group_error is not None:
        code, why = capture.group_error
        raise NpuError(code, f"the task group has no handle: {why}")
    if capture.invalid is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
            f"the capture was invalidated: {capture.invalid}",
        )
    capture.graph.groups.append(group)
    return group


def _capture(stream: Stream) -> Capture:
    if stream.capture is None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
            "the stream is not being captured (aclmdlRICaptureBegin first)",
        )
    return stream.capture


def begin_update(stream: Stream, group: TaskGroup) -> None:
    """aclmdlRICaptureTaskUpdateBegin: the kernels launched on `stream` from now on update
    `group`'s. 107027 on a stream in capture, 107033 a stream updating already or a group
    another stream updates."""
    _not_capturing(stream)
    if stream.updating is not None or group.updater is not None:
        raise NpuError(
            codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
            "the stream updates a task group already"
            if stream.updating is not None
            else "another stream updates this task group now",
        )
    stream.updating, group.updater, group.next = group, stream, 0


def end_update(stream: Stream) -> None:
    """aclmdlRICaptureTaskUpdateEnd: 107027 on a stream in capture, 107033 a stream not
    updating; 507000 if fewer kernels were launched than the group has."""
    _not_capturing(stream)
    updated = stream.updating
    if updated is None:
        raise NpuError(
            codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
            "the stream is not updating a task group (aclmdlRICaptureTaskUpdateBegin first)",
        )
    stream.updating = updated.updater = None
    if updated.next < len(updated.tasks):
        raise NpuError(
            codes.ACL_ERROR_RT_INTERNAL_ERROR,
            f"the task group has {len(updated.tasks)} kernel(s) and only {updated.next} "
            "were launched to update them",
        )


def _not_capturing(stream: Stream) -> None:
    if stream.capture is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_CAPTURED,
            "a stream in capture cannot update a task group (use another stream)",
        )


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
