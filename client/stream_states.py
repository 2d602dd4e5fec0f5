"""Stream state callbacks (aclrtRegStreamStateCallback): called by name, in registration
order, on the thread that creates a stream (ACL_RT_STREAM_STATE_CREATE_POST, after it
exists) or destroys one (ACL_RT_STREAM_STATE_DESTROY_PRE, before it goes). The registry is
the process's: it outlives acl.finalize, as the CANN runtime's does."""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable

StreamStateCallback = Callable[[int, int, object], object]  # (stream, state, args)


class StreamStates:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: dict[str, tuple[StreamStateCallback, object]] = {}

    def register(self, name: str, callback: StreamStateCallback | None, args: object) -> None:
        """aclrtRegStreamStateCallback: a callback for `name` (None: remove it)."""
        with self._lock:
            if callback is None:
                self._callbacks.pop(name, None)
            else:
                self._callbacks[name] = (callback, args)

    def notify(self, stream: int, state: int) -> None:
        """Tell every callback that `stream` reached `state`; one that raises is reported on
        stderr and does not fail the stream call."""
        with self._lock:
            callbacks = list(self._callbacks.values())
        for callback, args in callbacks:
            try:
                callback(stream, state, args)
            except Exception:  # noqa: BLE001 - a user's callback must not fail the call
                sys.stderr.write("simnpu: a stream state callback raised:\n")
                traceback.print_exc()


STREAM_STATES = StreamStates()
