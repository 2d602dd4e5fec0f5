"""Streams and events (aclrtCreateStream, aclrtCreateEvent and their calls)."""

from __future__ import annotations

import threading

from simnpu.client.device import runtime
from simnpu.proto import codes

_local = threading.local()


def current_stream() -> Stream:
    """The stream `with stream:` made current in this thread, else the default stream."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else Stream.wrap(0)


def _handle(stream) -> int:
    return current_stream().handle if stream is None else stream.handle


class Stream:
    """A stream of the current context. `with stream:` makes it current for this thread
    (calls without an explicit stream use it); destroy() releases it."""

    def __init__(self, priority: int = 0, flags: int = 0):
        self.handle = runtime().create_stream(priority, flags)
        self.priority = priority
        self._owned = True

    @classmethod
    def wrap(cls, handle: int) -> Stream:
        """A Stream object for an existing handle (0 = the default stream); not owned."""
        stream = cls.__new__(cls)
        stream.handle, stream.priority, stream._owned = handle, 0, False
        return stream

    def __repr__(self) -> str:
        return f"<simnpu Stream {self.handle:#x}>"

    def __enter__(self) -> Stream:
        if not hasattr(_local, "stack"):
            _local.stack = []
        _local.stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _local.stack.pop()

    def synchronize(self, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeStream(WithTimeout): blocks; raises the stream's task failure."""
        runtime().synchronize_stream(self.handle, timeout_ms)

    def query(self) -> bool:
        """aclrtStreamQuery: True when every task submitted so far has finished."""
        return runtime().stream_query(self.handle) == codes.ACL_STREAM_STATUS_COMPLETE

    def wait_event(self, event: Event) -> None:
        """aclrtStreamWaitEvent (async): later tasks wait for the event's latest record."""
        runtime().stream_wait_event(self.handle, event.handle)

    def record(self, event: Event | None = None) -> Event:
        """aclrtRecordEvent (async) of `event` (a new one if None) on this stream."""
        event = event if event is not None else Event()
        event.record(self)
        return event

    def set_failure_mode(self, mode: int) -> None:
        """aclrtSetStreamFailureMode (ACL_CONTINUE_ON_FAILURE / ACL_STOP_ON_FAILURE)."""
        runtime().set_stream_failure_mode(self.handle, mode)

    def destroy(self, force: bool = False) -> None:
        """aclrtDestroyStream (waits for its tasks; force drops queued ones). Idempotent."""
        if self._owned:
            self._owned = False
            runtime().destroy_stream(self.handle, force)


class Event:
    """An event of the current context (flags: ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE, ...)."""

    def __init__(self, flags: int = 0):
        self.handle = runtime().create_event(flags)
        self._alive = True

    def __repr__(self) -> str:
        return f"<simnpu Event {self.handle:#x}>"

    def record(self, stream: Stream | None = None) -> None:
        """aclrtRecordEvent (async), on `stream` or the current stream."""
        runtime().record_event(self.handle, _handle(stream))

    def reset(self, stream: Stream | None = None) -> None:
        """aclrtResetEvent (async)."""
        runtime().reset_event(self.handle, _handle(stream))

    def synchronize(self, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeEvent(WithTimeout): blocks until the latest record completes."""
        runtime().synchronize_event(self.handle, timeout_ms)

    def query(self) -> bool:
        """aclrtQueryEventStatus: True once the latest record has completed."""
        return runtime().query_event_status(self.handle) == codes.ACL_EVENT_RECORDED_STATUS_COMPLETE

    def elapsed_time(self, end: Event) -> float:
        """aclrtEventElapsedTime: milliseconds from this event's record to `end`'s."""
        return runtime().event_elapsed_time(self.handle, end.handle)

    def destroy(self) -> None:
        """aclrtDestroyEvent. Idempotent."""
        if self._alive:
            self._alive = False
            runtime().destroy_event(self.handle)
