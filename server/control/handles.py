"""A session's handle table: the objects behind the handles a client holds, and what kind
each handle stands for."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator
from typing import Any, TypeVar

from simnpu.proto import commands
from simnpu.proto.errors import bad_handle

T = TypeVar("T")


class HandleKind(enum.IntEnum):
    """What a handle stands for. A handle is `kind << 40 | n`, n counting up per session, so
    a handle of another kind, another session or a freed object is never mistaken for a
    live one (107017)."""

    CONTEXT = 1
    STREAM = 2
    EVENT = 3
    BINARY = 4
    FUNCTION = 5
    PINNED = 6
    MEM_POOL = 7
    PHYSICAL = 8  # a physical allocation (aclrtMallocPhysical, server/memory/virtual_memory.py)
    NOTIFY = 45
    CNT_NOTIFY = 170
    IPC_EVENT = 180  # another client's IPC event, opened in this one (server/core/ipc_events.py)
    MODEL_RI = 230  # a model run instance: a captured graph (server/graphs/capture.py)
    MODEL_STREAM = 231  # a stream of a model (aclmdlRIGetStreams)
    MODEL_TASK = 232  # a task of a model (aclmdlRIGetTasksByStream)
    REPLAY_STREAM = 233  # a replay's private stream: never in the table, never the client's
    LABEL = 246  # a label of built models' control flow (server/graphs/model_build.py)
    LABEL_LIST = 247  # a label list (aclrtCreateLabelList)
    TASK_GROUP = 243  # a task group of a model (aclmdlRICaptureTaskGrpEnd)
    COND_HANDLE = 248  # a condition of a captured model (server/graphs/cond_handles.py)
    COMMUNICATOR = 16


class Handles:
    """Handle -> object of one session. Used by its own thread and, for a few calls, under
    the scheduler lock; each entry is set and removed atomically."""

    def __init__(self, builtin_binary: object):
        self._objects: dict[int, Any] = {commands.BUILTIN_BINARY: builtin_binary}
        self._numbers = itertools.count(1)

    def add(self, obj: object, kind: HandleKind) -> int:
        handle = (kind << 40) | next(self._numbers)
        self._objects[handle] = obj
        return handle

    def get(self, handle: int, cls: type[T], what: str) -> T:
        """The live object of class `cls` behind `handle`; else 107017 naming `what`."""
        obj = self._objects.get(handle)
        if not isinstance(obj, cls):
            raise bad_handle(what, handle)
        return obj

    def find(self, handle: int, cls: type[T]) -> T | None:
        """The live object of class `cls` behind `handle`, or None."""
        obj = self._objects.get(handle)
        return obj if isinstance(obj, cls) else None

    def remove(self, handle: int) -> Any:
        """Forget `handle` (nothing if it is not known); the object it stood for."""
        return self._objects.pop(handle, None)

    def unique(self) -> int:
        """A number unused in this session (for segment names)."""
        return next(self._numbers)

    def items(self) -> Iterator[tuple[int, Any]]:
        """(handle, object) of every live handle, safe to change while iterating."""
        return iter(list(self._objects.items()))

    def clear(self) -> None:
        self._objects.clear()
