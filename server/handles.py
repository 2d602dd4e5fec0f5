"""A session's handle table: the ints a client holds for its contexts, streams, events,
binaries, functions, pinned segments, memory pools and communicators.

A handle is `kind << 40 | n` with n counting up per session, so a handle of another kind,
another session or a freed object is never mistaken for a live one (107017).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator
from typing import Any, TypeVar

from simnpu.proto.commands import BUILTIN_BINARY
from simnpu.proto.errors import bad_handle

T = TypeVar("T")


class HandleKind(enum.IntEnum):
    CONTEXT = 1
    STREAM = 2
    EVENT = 3
    BINARY = 4
    FUNCTION = 5
    PINNED = 6
    MEM_POOL = 7
    COMMUNICATOR = 16


class Handles:
    """Handle -> object of one session. Used by its own thread and, for a few calls, under
    the scheduler lock; each entry is set and removed atomically."""

    def __init__(self, builtin_binary: object):
        self._objects: dict[int, Any] = {BUILTIN_BINARY: builtin_binary}
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
