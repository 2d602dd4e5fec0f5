"""rt.events: event calls -- create and destroy, record, reset and wait (also with a flag
or a timeout), elapsed time and timestamps, IPC events (aclrtIpcGetEventHandle,
aclrtIpcOpenEventHandle). Synchronizing with an event and querying it are
client/runtime/synchronization.py's.

An event's record (client/runtime/contexts.py) keeps its latest record's stream and number
while the streams' completion signals may decide calls on it. IPC events (created with
ACL_EVENT_IPC, or opened) are refused by aclrtResetEvent and the deprecated aclrtQueryEvent
(207000); what sharing an event means: server/core/ipc_events.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.client.last_error import records_errors
from simnpu.client.runtime.arguments import wire_int
from simnpu.client.runtime.contexts import EventRecord
from simnpu.client.transport import call_site
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, bad_handle, invalid

if TYPE_CHECKING:
    from simnpu.client.runtime.shared import Shared

IPC_EVENT_HANDLE_SIZE = 64
"""ACL_IPC_EVENT_HANDLE_SIZE: the bytes of an aclrtIpcEventHandle."""
# event flags whose records the daemon treats as a plain event's (signals may decide them)
_SIGNALED_EVENT_FLAGS = codes.ACL_EVENT_SYNC | codes.ACL_EVENT_TIME_LINE


class Events:
    """Event calls (see the module docstring)."""

    def __init__(self, shared: Shared, signals: bool):
        self._calls, self._connection = shared.calls, shared.connection
        self._contexts = contexts = shared.contexts
        self._streams, self._events = contexts.streams, contexts.events
        self._capture_modes = shared.capture_modes
        self._signals = signals  # streams have completion signals (the fast path is mapped)

    def _record(self, handle: int) -> EventRecord:
        record = self._events.get(handle)
        if record is None:
            raise bad_handle("event", handle)
        return record

    # ---- creating and destroying --------------------------------------------------------------
    @records_errors
    def create_event(self, flags: int = 0, site: str | None = None) -> int:
        """aclrtCreateEvent / aclrtCreateEventWithFlag. Blocks."""
        context = self._contexts.current()
        wire_int(flags, "flags")
        if flags & codes.ACL_EVENT_IPC and flags != codes.ACL_EVENT_IPC:
            raise invalid(f"event flags {flags:#x}: ACL_EVENT_IPC is used alone")
        handle = self._calls.request(
            pb.CreateEventRequest(context=context.handle, flags=flags), site
        ).event
        signaled = self._signals and not flags & ~_SIGNALED_EVENT_FLAGS
        self._contexts.add_event(
            EventRecord(handle, context, flags == codes.ACL_EVENT_IPC, signaled)
        )
        return handle

    @records_errors
    def destroy_event(self, handle: int, site: str | None = None) -> None:
        """aclrtDestroyEvent. Blocks."""
        self._calls.request(pb.DestroyEventRequest(event=self._record(handle).handle), site)
        self._contexts.drop_event(handle)

    # ---- in stream order -----------------------------------------------------------------------
    @records_errors
    def record_event(self, event: int, stream: int, site: str | None = None) -> None:
        """aclrtRecordEvent (async)."""
        record = self._events.get(event)
        if record is None:
            raise bad_handle("event", event)
        if stream not in self._streams:
            stream = self._contexts.stream(stream)
        seq = self._connection.send_command(
            commands.RecordEvent.pack(event, stream),
            site or call_site(),
            stream,
        )
        if record.signaled:
            record.latest = (stream, seq)

    @records_errors
    def reset_event(self, event: int, stream: int, site: str | None = None) -> None:
        """aclrtResetEvent (async); 207000 for an IPC event."""
        record, stream = self._record(event), self._contexts.stream(stream)
        self.not_for_ipc(event, "aclrtResetEvent")
        self._calls.command(commands.ResetEvent.pack(event, stream), stream, site)
        record.signaled = False  # it undoes records made after it, until it runs
        record.latest = None

    @records_errors
    def stream_wait_event(self, stream: int, event: int, site: str | None = None) -> None:
        """aclrtStreamWaitEvent (async): the stream waits for the event's latest record."""
        event, stream = self._record(event).handle, self._contexts.stream(stream)
        self._calls.command(commands.WaitEvent.pack(event, stream), stream, site)

    @records_errors
    def record_event_with_flag(
        self, event: int, stream: int, flag: int, site: str | None = None
    ) -> None:
        """aclrtRecordEventWithFlag (async): ACL_EVENT_RECORD_DEFAULT records as
        aclrtRecordEvent; ACL_EVENT_RECORD_EXTERNAL records into the model a stream this
        process began capturing records into (else 107029), seen outside it at each replay."""
        if not event:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "event is null")
        if flag == codes.ACL_EVENT_RECORD_DEFAULT:
            self.record_event(event, stream, site)
            return
        if flag != codes.ACL_EVENT_RECORD_EXTERNAL:
            raise _flag(flag, "ACL_EVENT_RECORD_DEFAULT or ACL_EVENT_RECORD_EXTERNAL")
        self._external(event, stream, "record")
        self.record_event(event, stream, site)  # a graph's records are seen outside it anyway

    def _external(self, event: int, stream: int, what: str) -> None:
        """An external event `what` (record, wait) needs an event of this process and a
        stream this process is capturing (107029)."""
        self._record(event)
        if not self._capture_modes.capturing(self._contexts.stream(stream)):
            raise NpuError(
                codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
                f"an external event {what} belongs in a stream being captured into a model "
                "(aclmdlRICaptureBegin), and this stream is not",
            )

    @records_errors
    def stream_wait_event_with_flag(
        self, stream: int, event: int, timeout: int, flag: int, site: str | None = None
    ) -> None:
        """aclrtStreamWaitEventWithFlag (async): ACL_EVENT_WAIT_DEFAULT waits as
        aclrtStreamWaitEventWithTimeout; ACL_EVENT_WAIT_EXTERNAL (timeout 0 only) waits
        inside the model a stream this process began capturing records into (else 107029),
        each replay for the event's latest record when it is submitted."""
        if not event:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "event is null")
        if flag == codes.ACL_EVENT_WAIT_DEFAULT:
            self.stream_wait_event_with_timeout(stream, event, _as_int32(timeout), site)
            return
        if flag != codes.ACL_EVENT_WAIT_EXTERNAL:
            raise _flag(flag, "ACL_EVENT_WAIT_DEFAULT or ACL_EVENT_WAIT_EXTERNAL")
        if timeout:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"timeout {timeout}: ACL_EVENT_WAIT_EXTERNAL takes timeout 0 only",
            )
        self._external(event, stream, "wait")
        self.stream_wait_event(stream, event, site)  # a replay binds it to the latest record then

    @records_errors
    def stream_wait_event_with_timeout(
        self, stream: int, event: int, timeout: int, site: str | None = None
    ) -> None:
        """aclrtStreamWaitEventWithTimeout (async): timeout in seconds, 0 never times out; a
        wait whose event has not completed in time fails with 107019 at the stream's next
        synchronize, and the stream goes on."""
        if timeout < 0:
            raise invalid(f"timeout {timeout}: use 0 (never) or a number of seconds")
        if not timeout:
            self.stream_wait_event(stream, event, site)
            return
        event, stream = self._record(event).handle, self._contexts.stream(stream)
        self._calls.command(commands.WaitEventTimeout.pack(event, stream, timeout), stream, site)

    # ---- times -----------------------------------------------------------------------------------
    @records_errors
    def event_elapsed_time(self, start: int, end: int, site: str | None = None) -> float:
        """aclrtEventElapsedTime: milliseconds between two completed records (device clock).
        Blocks."""
        reply = self._calls.request(
            pb.EventElapsedTimeRequest(
                start=self._record(start).handle, end=self._record(end).handle
            ),
            site,
        )
        return reply.nanoseconds / 1e6

    @records_errors
    def event_get_timestamp(self, event: int, site: str | None = None) -> int:
        """aclrtEventGetTimestamp: microseconds since the host system started (the device
        clock) at which the event's latest record ran. Blocks."""
        if not event:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "event is null")
        reply = self._calls.request(
            pb.EventTimestampRequest(event=self._record(event).handle), site
        )
        return reply.microseconds

    # ---- IPC events ------------------------------------------------------------------------------
    def not_for_ipc(self, event: int, call: str) -> None:
        """207000 if `event` is an IPC event, which `call` does not take."""
        record = self._events.get(event)
        if record is not None and record.ipc:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, f"{call} is not supported for IPC events"
            )

    @records_errors
    def ipc_get_event_handle(self, event: int, site: str | None = None) -> bytes:
        """aclrtIpcGetEventHandle: the event's 64-byte handle (ACL_EVENT_IPC events only).
        Blocks."""
        reply = self._calls.request(
            pb.IpcGetEventHandleRequest(event=self._record(event).handle), site
        )
        return reply.handle

    @records_errors
    def ipc_open_event_handle(self, handle: bytes, site: str | None = None) -> int:
        """aclrtIpcOpenEventHandle: another process's IPC event, in the current context.
        Blocks."""
        if len(handle) != IPC_EVENT_HANDLE_SIZE:
            raise invalid(
                f"an IPC event handle has {IPC_EVENT_HANDLE_SIZE} bytes, not {len(handle)}"
            )
        context = self._contexts.current()
        reply = self._calls.request(
            pb.IpcOpenEventHandleRequest(handle=handle, context=context.handle), site
        )
        self._contexts.add_event(EventRecord(reply.event, context, ipc=True, signaled=False))
        return reply.event


def _as_int32(value: int) -> int:
    """A uint32 as the int32 the runtime passes it on as."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _flag(flag: int, choices: str) -> NpuError:
    return NpuError(codes.ACL_ERROR_INVALID_PARAM, f"flag {flag}: use {choices}")
