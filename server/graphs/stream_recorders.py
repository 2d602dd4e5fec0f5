"""Which recorders a stream has (server/core/recorder.py), found and changed, and the marks of
task groups that depend on them (aclmdlRICaptureTaskGrpBegin / End,
aclmdlRICaptureTaskUpdateBegin / End), with the runtime's checks and codes.

The capture a stream is in holds it above the model it is bound to, which holds it above
the task group it updates (aclmdlRICaptureTaskUpdateBegin .. End): the stream holds the
first of them it has (`Stream.recorder`), and a capture or a model keeps the one below it
(`below`), which the stream gets back when they let it go. Binding, unbinding and updates
are refused on a stream in capture, so a capture is the last recorder a stream gets and the
first it loses; an update begun on a bound stream goes in below its model. The capture a
stream is in is `capture.capture_of`, the model it is bound to `model_build.bound_to`.
Under the scheduler lock (the finders also on a session's thread, reading what only the
lock's holder changes, as they always have); the marks in order with the launches around
them, as capture begin and end are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.graphs.capture import Capture, capture_of
from simnpu.server.graphs.model_build import Build
from simnpu.server.graphs.task_groups import TaskGroup

if TYPE_CHECKING:
    from simnpu.server.core.recorder import Recorder
    from simnpu.server.core.streams import Stream


def _recorders(stream: Stream) -> Iterator[Recorder]:
    """The recorders `stream` has, the one it holds first."""
    recorder = stream.recorder
    while recorder is not None:
        yield recorder
        recorder = recorder.below.get(stream) if isinstance(recorder, Capture | Build) else None


def updated_by(stream: Stream) -> TaskGroup | None:
    """The task group `stream` updates, if any."""
    return next((r for r in _recorders(stream) if isinstance(r, TaskGroup)), None)


# ---- the marks of task groups -------------------------------------------------------------------
def begin_group(stream: Stream) -> None:
    """aclmdlRICaptureTaskGrpBegin: 107029 not in capture, 107033 a group open already or the
    stream updating one."""
    capture = _capture(stream)
    updating = updated_by(stream)
    if stream in capture.groups or updating is not None:
        raise NpuError(
            codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
            "a task group is open on this stream already (aclmdlRICaptureTaskGrpEnd it)"
            if updating is None
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
    capture = capture_of(stream)
    if capture is None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
            "the stream is not being captured (aclmdlRICaptureBegin first)",
        )
    return capture


def begin_update(stream: Stream, group: TaskGroup) -> None:
    """aclmdlRICaptureTaskUpdateBegin: the kernels launched on `stream` from now on update
    `group`'s, from its first on -- unless the stream is bound to a model, which records them
    instead while it is (the group goes in below the model). 107027 on a stream in capture,
    107033 a stream updating already or a group another stream updates."""
    _not_capturing(stream)
    updating = updated_by(stream)
    if updating is not None or group.updater is not None:
        raise NpuError(
            codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
            "the stream updates a task group already"
            if updating is not None
            else "another stream updates this task group now",
        )
    group.updater, group.next = stream, 0
    recorder = stream.recorder
    if isinstance(recorder, Build):
        recorder.below[stream] = group
    else:
        stream.recorder = group


def end_update(stream: Stream) -> None:
    """aclmdlRICaptureTaskUpdateEnd: 107027 on a stream in capture, 107033 a stream not
    updating; 507000 if fewer kernels were launched than the group has."""
    _not_capturing(stream)
    updated = updated_by(stream)
    if updated is None:
        raise NpuError(
            codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS,
            "the stream is not updating a task group (aclmdlRICaptureTaskUpdateBegin first)",
        )
    updated.updater = None
    recorder = stream.recorder
    if isinstance(recorder, Build):
        recorder.below[stream] = None
    else:
        stream.recorder = None
    if updated.next < len(updated.tasks):
        raise NpuError(
            codes.ACL_ERROR_RT_INTERNAL_ERROR,
            f"the task group has {len(updated.tasks)} kernel(s) and only {updated.next} "
            "were launched to update them",
        )


def _not_capturing(stream: Stream) -> None:
    if capture_of(stream) is not None:
        raise NpuError(
            codes.ACL_ERROR_RT_STREAM_CAPTURED,
            "a stream in capture cannot update a task group (use another stream)",
        )
