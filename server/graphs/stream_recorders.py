"""Which recorders a stream has (server/core/recorder.py), found and changed.

The capture a stream is in holds it above the model it is bound to, which holds it above
the task group it updates (aclmdlRICaptureTaskUpdateBegin .. End): the stream holds the
first of them it has (`Stream.recorder`), and a capture or a model keeps the one below it
(`below`), which the stream gets back when they let it go. Binding, unbinding and updates
are refused on a stream in capture, so a capture is the last recorder a stream gets and the
first it loses; an update begun on a bound stream goes in below its model. Under the
scheduler lock (the finders also on a session's thread, reading what only the lock's holder
changes, as they always have).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from simnpu.server.graphs.capture import Capture
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


def bound_to(stream: Stream) -> Build | None:
    """The model `stream` is bound to (aclmdlRIBindStream), if any."""
    return next((r for r in _recorders(stream) if isinstance(r, Build)), None)


def updated_by(stream: Stream) -> TaskGroup | None:
    """The task group `stream` updates, if any."""
    return next((r for r in _recorders(stream) if isinstance(r, TaskGroup)), None)


def begin_update(stream: Stream, group: TaskGroup) -> None:
    """aclmdlRICaptureTaskUpdateBegin on `stream` (in no capture, updating no group): its
    kernel launches update `group`'s kernels from the first on -- unless the stream is bound
    to a model, which records them instead while it is."""
    group.updater, group.next = stream, 0
    recorder = stream.recorder
    if isinstance(recorder, Build):
        recorder.below[stream] = group
    else:
        stream.recorder = group


def end_update(stream: Stream, group: TaskGroup) -> None:
    """aclmdlRICaptureTaskUpdateEnd on `stream`, which updates `group` (in no capture)."""
    group.updater = None
    recorder = stream.recorder
    if isinstance(recorder, Build):
        recorder.below[stream] = None
    else:
        stream.recorder = None
