"""Streams and events (aclrtCreateStream, aclrtCreateEvent and their calls)."""

from __future__ import annotations

import threading

from simnpu.client.device import runtime
from simnpu.client.transport import call_site
from simnpu.proto import codes

_local = threading.local()


def current_stream() -> Stream:
    """The stream `with stream:` made current in this thread, else the default stream of
    the current context (handle 0). Calls given no stream use it. No ACL call. Local."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else Stream.wrap(0)


def _handle(stream) -> int:
    return current_stream().handle if stream is None else stream.handle


class Stream:
    """aclrtCreateStreamWithConfig: a new stream of this thread's current context
    (`priority` 0 highest .. 7, clamped; `flags` `ACL_STREAM_*`). Tasks of one stream run in
    order; tasks of different streams may overlap. `with stream:` makes it current for this
    thread (calls without an explicit stream use it) and does not destroy it; destroy()
    releases it. Blocks."""

    def __init__(self, priority: int = 0, flags: int = 0):
        self.handle = runtime().streams.create_stream(priority, flags, site=call_site())
        self.priority = priority
        self._owned = True

    @classmethod
    def wrap(cls, handle: int) -> Stream:
        """A Stream object for an existing handle, e.g. one `acl.rt.create_stream` returned
        (0: the current context's default stream); not owned, so destroy() leaves the stream
        alone. No ACL call. Local."""
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
        """aclrtSynchronizeStream(WithTimeout): wait until every task submitted to the stream
        so far has run, and raise the first failure among them (NpuError with the failing
        call's site). Blocks; `timeout_ms` -1 waits forever, a timeout raises 507046."""
        runtime().sync.synchronize_stream(self.handle, timeout_ms)

    def query(self) -> bool:
        """aclrtStreamQuery: True when every task submitted so far has finished. Blocks (asks
        the daemon; never waits for the tasks)."""
        status = runtime().sync.stream_query(self.handle)
        return status == codes.ACL_STREAM_STATUS_COMPLETE

    def wait_event(self, event: Event) -> None:
        """aclrtStreamWaitEvent: tasks submitted to this stream later wait for the event's
        latest record (on the device; the host does not wait). Asynchronous."""
        runtime().events.stream_wait_event(self.handle, event.handle, site=call_site())

    def record(self, event: Event | None = None) -> Event:
        """aclrtRecordEvent of `event` on this stream; returns the event (a new Event, made
        with aclrtCreateEvent, when None). Asynchronous (creating the event Blocks)."""
        event = event if event is not None else Event()
        event.record(self)
        return event

    def set_failure_mode(self, mode: int) -> None:
        """aclrtSetStreamFailureMode: ACL_CONTINUE_ON_FAILURE (the default) or
        ACL_STOP_ON_FAILURE, which stops every stream of the context at the first failure
        (and cannot be turned back: 207000). Blocks."""
        runtime().streams.set_stream_failure_mode(self.handle, mode, site=call_site())

    def destroy(self, force: bool = False) -> None:
        """aclrtDestroyStream: waits for its tasks, then releases it; with `force`,
        aclrtDestroyStreamForce drops the queued ones instead. Blocks. Idempotent; a wrapped
        stream is left alone."""
        if self._owned:
            self._owned = False
            runtime().streams.destroy_stream(self.handle, force, site=call_site())


class Event:
    """aclrtCreateEventWithFlag: an event of this thread's current context (`flags`
    ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE, ...; 0 is aclrtCreateEvent), a marker that streams
    record and wait for. Blocks."""

    def __init__(self, flags: int = 0):
        self.handle = runtime().events.create_event(flags, site=call_site())
        self._alive = True

    def __repr__(self) -> str:
        return f"<simnpu Event {self.handle:#x}>"

    def record(self, stream: Stream | None = None) -> None:
        """aclrtRecordEvent on `stream` (default: current_stream()): the event completes when
        the stream reaches this point. Asynchronous."""
        runtime().events.record_event(self.handle, _handle(stream), site=call_site())

    def reset(self, stream: Stream | None = None) -> None:
        """aclrtResetEvent on `stream` (default: current_stream()). Asynchronous."""
        runtime().events.reset_event(self.handle, _handle(stream), site=call_site())

    def synchronize(self, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeEvent(WithTimeout): wait until the event's latest record has
        completed. Blocks; `timeout_ms` -1 waits forever, a timeout raises 507047. Raises a
        task's failure only in ACL_STOP_ON_FAILURE; otherwise an earlier failed task of the
        record's stream is reported by that stream's synchronize, and this call warns about
        it on stderr (docs/errors.md)."""
        runtime().sync.synchronize_event(self.handle, timeout_ms)

    def query(self) -> bool:
        """aclrtQueryEventStatus: True once the latest record has completed. Blocks (asks the
        daemon; never waits for the record). Task failures: as synchronize()."""
        status = runtime().sync.query_event_status(self.handle)
        return status == codes.ACL_EVENT_RECORDED_STATUS_COMPLETE

    def elapsed_time(self, end: Event) -> float:
        """aclrtEventElapsedTime: milliseconds of device time from this event's record to
        `end`'s, once both records have completed (507006 while one is pending). Blocks."""
        return runtime().events.event_elapsed_time(self.handle, end.handle, site=call_site())

    def destroy(self) -> None:
        """aclrtDestroyEvent. Blocks. Idempotent."""
        if self._alive:
            self._alive = False
            runtime().events.destroy_event(self.handle, site=call_site())
