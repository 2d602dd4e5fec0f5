"""rt.contexts: the devices this process set, its contexts, the current context of each
thread, and the records of its streams and events.

A record holds everything the client keeps of one stream or one event (its context, what it
was created with, its completion signal, what a synchronize learnt of it), so that a stream
or an event that goes takes all of it along. The other parts are given the tables of records
(`streams`, `events`) and look a handle up there themselves on their hot paths; the calls
here resolve the rest (stream 0, bad handles).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, bad_handle, invalid

if TYPE_CHECKING:
    from simnpu.client.runtime.calls import Calls
    from simnpu.client.transport import CallLog


class ContextRecord:
    """A context of this process: its device, default stream, streams and events."""

    __slots__ = ("default_stream", "device", "events", "handle", "stops_on_failure", "streams")

    def __init__(self, handle: int, device: int, default_stream: int):
        self.handle = handle
        self.device = device
        self.default_stream = default_stream
        self.streams: set[int] = {default_stream}
        self.events: set[int] = set()
        self.stops_on_failure = False  # ACL_STOP_ON_FAILURE was set (it cannot be undone)


class StreamRecord:
    """A stream of this process."""

    __slots__ = (
        "bound_model",
        "context",
        "fast_sync",
        "flags",
        "handle",
        "long_wait",
        "overflow_switch",
        "priority",
        "slot",
    )

    def __init__(
        self, handle: int, context: ContextRecord, priority: int = 0, flags: int = 0, slot: int = -1
    ):
        self.handle = handle
        self.context = context
        self.priority = priority  # as created (clamped)
        self.flags = flags
        self.slot = slot  # its completion signal's slot in the notify area; -1: none
        self.fast_sync = bool(flags & codes.ACL_STREAM_FAST_SYNC)  # synchronize polls longer
        self.long_wait = False  # its last wait on the signal outlasted fast_path.POLL_S
        self.overflow_switch = 0  # aclrtSetStreamOverflowSwitch
        self.bound_model = 0  # the built model it is bound to (aclmdlRIBindStream)


class EventRecord:
    """An event of this process."""

    __slots__ = ("context", "handle", "ipc", "latest", "signaled")

    def __init__(self, handle: int, context: ContextRecord, ipc: bool, signaled: bool):
        self.handle = handle
        self.context = context
        self.ipc = ipc  # created with ACL_EVENT_IPC, or opened
        # its records may be decided on the streams' signals: there are signals, the daemon
        # treats its records as a plain event's, and it was not reset (a reset undoes records
        # made after it, until it runs)
        self.signaled = signaled
        self.latest: tuple[int, int] | None = None  # (stream, seq) of its latest record


class Contexts:
    """The devices, contexts and records of this process (see the module docstring)."""

    def __init__(
        self,
        calls: Calls,
        streams: dict[int, StreamRecord],
        device_count: int,
        log: CallLog,
        signals: bool,
    ):
        self._calls = calls
        self.streams = streams  # stream handle -> its record
        self.events: dict[int, EventRecord] = {}  # event handle -> its record
        self.device_count = device_count
        self._log = log
        self._signals = signals  # streams have completion signals (the fast path is mapped)
        self._contexts: dict[int, ContextRecord] = {}
        self._refs: dict[int, int] = {}  # device -> aclrtSetDevice references
        self._defaults: dict[int, int] = {}  # device -> its default context (aclrtSetDevice)
        self._local = threading.local()  # .context: the thread's current context
        self._lock = threading.Lock()

    # ---- devices -------------------------------------------------------------------------------
    def check_device(self, device: int) -> None:
        """107001 for a device that does not exist."""
        if not isinstance(device, int) or not 0 <= device < self.device_count:
            raise NpuError(
                codes.ACL_ERROR_RT_INVALID_DEVICEID,
                f"device {device} does not exist (device count {self.device_count})",
            )

    @records_errors
    def set_device(self, device: int, site: str | None = None) -> None:
        """aclrtSetDevice: bind the device to this thread (its default context becomes
        current). Blocks the first time (the context is made)."""
        self.check_device(device)
        with self._lock:
            if device not in self._defaults:
                self._defaults[device] = self._new_context(device, site).handle
            self._refs[device] = self._refs.get(device, 0) + 1
            self._local.context = self._contexts[self._defaults[device]]

    @records_errors
    def reset_device(self, device: int, drop_queued: bool = False, site: str | None = None) -> None:
        """aclrtResetDevice: drop one reference; the last one waits for the device's work
        and frees its default context and streams. Blocks. `drop_queued` (an interrupted
        program): the last one discards the tasks not started yet instead of waiting."""
        self.check_device(device)
        with self._lock:
            refs = self._refs.get(device, 0)
            if refs == 0:
                raise invalid(f"device {device} was not set by this process")
            self._refs[device] = refs - 1
            release = refs == 1
            handle = self._defaults.pop(device) if release else None
        if handle is not None:  # the last reference was released
            self._destroy_context(handle, drop_queued, site)

    @records_errors
    def reset_device_force(self, device: int, site: str | None = None) -> None:
        """aclrtResetDeviceForce: release the device whatever its reference count. Blocks."""
        for _ in range(max(self._refs.get(device, 0), 1)):
            self.reset_device(device, site=site)

    @records_errors
    def get_device(self) -> int:
        """aclrtGetDevice: the device of this thread's current context."""
        return self.current().device

    @records_errors
    def get_device_count(self) -> int:
        """aclrtGetDeviceCount."""
        return self.device_count

    # ---- contexts ------------------------------------------------------------------------------
    def current(self) -> ContextRecord:
        """This thread's current context (107002 without one)."""
        context = getattr(self._local, "context", None)
        if context is None:
            raise NpuError(
                codes.ACL_ERROR_RT_CONTEXT_NULL,
                "no current context in this thread: call set_device or set_context first",
            )
        return context

    def current_or_none(self) -> ContextRecord | None:
        """This thread's current context, if it has one."""
        return getattr(self._local, "context", None)

    def context(self, handle: int) -> ContextRecord:
        """The context `handle` of this process (107017 for another)."""
        context = self._contexts.get(handle)
        if context is None:
            raise bad_handle("context", handle)
        return context

    def of_device(self, device: int) -> list[ContextRecord]:
        """This process's contexts on `device`."""
        return [c for c in list(self._contexts.values()) if c.device == device]

    def _new_context(self, device: int, site: str | None) -> ContextRecord:
        reply = self._calls.request(pb.CreateContextRequest(device=device), site)
        context = ContextRecord(reply.context, device, reply.default_stream)
        self._contexts[context.handle] = context
        self.streams[context.default_stream] = StreamRecord(
            context.default_stream, context, slot=self._slot(reply)
        )
        return context

    @records_errors
    def create_context(self, device: int, site: str | None = None) -> int:
        """aclrtCreateContext: a new context on `device`, made current for this thread."""
        self.check_device(device)
        context = self._new_context(device, site)
        self._local.context = context
        return context.handle

    @records_errors
    def destroy_context(self, handle: int, site: str | None = None) -> None:
        """aclrtDestroyContext: waits for its streams, then frees them. Blocks."""
        self.context(handle)
        if handle in self._defaults.values():
            raise invalid(
                "the default context of a device is released by reset_device, not destroy_context"
            )
        self._destroy_context(handle, False, site)

    def _destroy_context(self, handle: int, drop_queued: bool, site: str | None) -> None:
        context = self._contexts.pop(handle)
        for stream in context.streams:
            self.streams.pop(stream, None)
            self._log.forget_stream(stream)
        for event in context.events:
            self.events.pop(event, None)
        if getattr(self._local, "context", None) is context:
            self._local.context = None
        self._calls.request(pb.DestroyContextRequest(context=handle, drop_queued=drop_queued), site)

    @records_errors
    def set_context(self, handle: int) -> None:
        """aclrtSetCurrentContext (per thread)."""
        self._local.context = self.context(handle)

    @records_errors
    def get_context(self) -> int:
        """aclrtGetCurrentContext."""
        return self.current().handle

    @records_errors
    def default_stream(self) -> int:
        """aclrtCtxGetCurrentDefaultStream: the handle stream 0 stands for in this thread."""
        return self.current().default_stream

    # ---- stream and event records -------------------------------------------------------------
    def stream(self, handle: int) -> int:
        """The stream a call means: 0 is the current context's default stream (107017 for
        a handle that is not a stream of this process)."""
        return self.stream_record(handle).handle

    def stream_record(self, handle: int) -> StreamRecord:
        """The record of the stream a call means (as `stream`)."""
        if handle == 0 or handle is None:
            return self.streams[self.current().default_stream]
        record = self.streams.get(handle)
        if record is None:
            raise bad_handle("stream", handle)
        return record

    def add_stream(
        self, context: ContextRecord, handle: int, priority: int, flags: int, reply: Any
    ) -> StreamRecord:
        """A stream the daemon made in `context` (`reply` may give its signal's slot)."""
        record = StreamRecord(handle, context, priority, flags, self._slot(reply))
        context.streams.add(handle)
        self.streams[handle] = record
        return record

    def drop_stream(self, record: StreamRecord) -> None:
        """The stream is gone, and all the client kept of it."""
        record.context.streams.discard(record.handle)
        self.streams.pop(record.handle, None)
        self._log.forget_stream(record.handle)

    def _slot(self, reply: Any) -> int:
        """The slot of the new stream's completion signal, if this session reads signals."""
        return reply.signal_slot if self._signals and reply.HasField("signal_slot") else -1

    def event_record(self, handle: int) -> EventRecord:
        """The record of event `handle` of this process (107017 for another)."""
        record = self.events.get(handle)
        if record is None:
            raise bad_handle("event", handle)
        return record

    def add_event(self, record: EventRecord) -> None:
        record.context.events.add(record.handle)
        self.events[record.handle] = record

    def drop_event(self, handle: int) -> None:
        record = self.events.pop(handle)
        record.context.events.discard(handle)
