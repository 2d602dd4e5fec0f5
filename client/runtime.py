"""The raw layer: one method per AscendCL runtime call, every status checked.

A Runtime is this process's session with the daemon plus what the host side of ACL
keeps: device reference counts, contexts, the current context of each thread, and tables
of the handles and allocations this process owns, so that what the host can check is
checked here, at once, without a round trip. Failures raise NpuError (and are kept as
the thread's last error). The Pythonic API and the `acl` facade both stand on this.

Calls marked "async" return at once; the rest block until the daemon answers.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message

from simnpu.client import fast_path, last_error
from simnpu.client.callbacks import HostCallbacks
from simnpu.client.capture_modes import CaptureModes
from simnpu.client.copies import CopyPaths
from simnpu.client.exceptions import EXCEPTIONS
from simnpu.client.hostmem import HostMemory
from simnpu.client.kernel_args import KernelArgs
from simnpu.client.last_error import records_errors
from simnpu.client.observe import ClientObserver
from simnpu.client.runtime_builtin_tasks import RuntimeBuiltinTasks
from simnpu.client.runtime_cnt_notify import RuntimeCntNotify
from simnpu.client.runtime_cond_tasks import RuntimeCondTasks
from simnpu.client.runtime_devices import RuntimeDevices
from simnpu.client.runtime_graphs import Model, RuntimeGraphs
from simnpu.client.runtime_host_register import RuntimeHostRegister
from simnpu.client.runtime_ipc_events import RuntimeIpcEvents
from simnpu.client.runtime_managed import RuntimeManagedMemory
from simnpu.client.runtime_memory import (
    RuntimeMemory,
    check_allocatable,
    env_memory_limit,
    wire_int,
)
from simnpu.client.runtime_model_build import RuntimeModelBuild
from simnpu.client.runtime_notify import RuntimeNotify
from simnpu.client.runtime_overflow import RuntimeOverflow
from simnpu.client.runtime_peers import RuntimePeers
from simnpu.client.runtime_shareable import RuntimeShareableMemory
from simnpu.client.runtime_streams import RuntimeStreams
from simnpu.client.runtime_task_groups import RuntimeTaskGroups
from simnpu.client.runtime_values import RuntimeValues
from simnpu.client.runtime_vmm import RuntimeVirtualMemory
from simnpu.client.stream_states import STREAM_STATES
from simnpu.client.transport import Connection, caller_site
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import (
    NotSupportedError,
    NpuError,
    bad_handle,
    check_num_blocks,
    invalid,
)
from simnpu.shm import heap
from simnpu.shm.addresses import DEVICE_BASE
from simnpu.shm.region import Region

if TYPE_CHECKING:  # imported by get_function: a session without kernels never needs it
    from simnpu.proto.kernel_abi import KernelSignature


class ContextInfo:
    __slots__ = ("default_stream", "device", "events", "handle", "stops_on_failure", "streams")

    def __init__(self, handle, device, default_stream):
        self.handle = handle
        self.device = device
        self.default_stream = default_stream
        self.streams = {default_stream}
        self.events = set()
        self.stops_on_failure = False  # ACL_STOP_ON_FAILURE was set (it cannot be undone)


class Runtime(
    RuntimeMemory,
    RuntimeVirtualMemory,
    RuntimeHostRegister,
    RuntimeManagedMemory,
    RuntimeShareableMemory,
    RuntimeStreams,
    RuntimePeers,
    RuntimeNotify,
    RuntimeCntNotify,
    RuntimeValues,
    RuntimeDevices,
    RuntimeOverflow,
    RuntimeBuiltinTasks,
    RuntimeIpcEvents,
    RuntimeGraphs,
    RuntimeModelBuild,
    RuntimeTaskGroups,
    RuntimeCondTasks,
):
    """This process's view of the simulated NPU. Thread-safe; one per process is usual."""

    def __init__(self, address: str | None = None, token: str | None = None):
        self.connection = Connection(address, token, on_callback=self._callback_arrived)
        self.callbacks = HostCallbacks(self.connection)
        self._local = threading.local()
        self._lock = threading.Lock()
        hello = self.connection.call(
            pb.HelloRequest(
                pid=os.getpid(),
                memory_limit=env_memory_limit(),
                process_name=os.path.basename(sys.argv[0] or "python") or "python",
            )
        )
        self.session_id, self.device_count = hello.session, hello.devices
        self.ai_cores, self.copy_engines = hello.ai_cores, hello.copy_engines
        self.host = HostMemory()
        staging = _attach_staging(hello.staging_segment, hello.staging_bytes, hello.probe)
        self.copies = CopyPaths(self, staging, hello.staging_bytes)
        if staging is None:  # copies travel in-stream: their chunks reuse warm heap memory
            heap.keep_freed_memory()
        # the fast path (docs/fast-path.md): calls through the submission ring, replies and
        # streams' completion signals through the notify area, when the staging probe showed
        # that this process shares the daemon's /dev/shm
        self.fast_path = (
            fast_path.attach(self.connection, hello.notify_segment, hello.ring_segment)
            if staging is not None
            else None
        )
        self.signals = self.fast_path.signals if self.fast_path else None
        self.contexts: dict[int, ContextInfo] = {}
        self.device_refs: dict[int, int] = {}
        self.device_contexts: dict[int, int] = {}  # device -> its default context (aclrtSetDevice)
        self.peer_access: set[tuple[int, int]] = set()  # (device, peer) enabled
        self.notifies: dict[int, int] = {}  # notify handle -> its device (created or imported)
        self.cnt_notifies: dict[int, int] = {}  # count notify handle -> its id
        self.stream_context: dict[int, ContextInfo] = {}
        self.stream_attrs: dict[int, tuple[int, int]] = {}  # stream -> (priority, flags)
        self._thread_res = threading.local()  # aclrtUseStreamResInCurrentThread's stream
        self._thread_res_used = False
        self.overflow_switches: dict[int, int] = {}  # stream -> 1 (aclrtSetStreamOverflowSwitch)
        self.sat_mode = codes.ACL_RT_OVERFLOW_MODE_INFNAN  # aclrtSetDeviceSatMode
        self.event_context: dict[int, ContextInfo] = {}
        self.ipc_events: set[int] = set()  # IPC events, created or opened
        self.unsignaled_events: set[int] = set()  # events signals never decide (flags, reset)
        self.allocation_starts: list[int] = []
        self.allocations: dict[int, tuple[int, int]] = {}  # address -> (size, device)
        self.imported: dict[str, int] = {}  # IPC key -> address (also in allocations)
        self.imported_counts: dict[str, int] = {}  # IPC key -> imports not yet closed
        self.pools: dict[int, int] = {}  # memory pool -> device
        self.pool_blocks: dict[int, int] = {}  # address -> its pool (also in allocations)
        self.reserved: dict[int, tuple[int, int]] = {}  # reserved range -> (size, device)
        self.reserved_starts: list[int] = []
        self.mappings: dict[int, tuple[int, int]] = {}  # mapped start -> (size, physical)
        self.mapping_starts: list[int] = []
        self.physical: dict[int, list[int]] = {}  # handle -> [size, device, attr, references]
        self._init_host_register()  # registered and managed host memory
        self._init_managed_advice()  # advice and prefetches of managed memory
        self.functions: dict[int, KernelSignature] = {}
        self.function_binary: dict[int, int] = {}  # function handle -> its binary
        self.binaries: set[int] = {commands.BUILTIN_BINARY}
        self.kernel_args = KernelArgs(self)  # aclrtKernelArgs* handles
        self.capture_modes = CaptureModes()  # which calls stream captures refuse
        self.models: dict[int, Model] = {}  # model run instances (aclmdlRI) of this process
        self.bound_streams: dict[int, int] = {}  # stream -> the model it is bound to
        self.capturing: dict[int, tuple[int, bool]] = {}  # stream -> (model, made by capture)
        self.model_tasks: dict[int, tuple[int, int]] = {}  # listed model task -> (type, position)
        self.task_args: dict[int, ctypes.Array] = {}  # model task -> its arguments read back
        self.stream_models: dict[int, int] = {}  # listed model stream -> its model
        self.task_models: dict[int, int] = {}  # listed model task -> its model
        self.unready: dict[int, str] = {}  # model -> why it does not replay
        self.conditions: dict[int, tuple[int, int]] = {}  # condition -> (model, address)
        self.sub_models: dict[int, int] = {}  # sub model of a cond task -> that task's model
        # tracing and checking: SIMNPU_TRACE / SIMNPU_CHECK, or the daemon's --trace / --check
        self.observer = ClientObserver(self, hello.observe_flags)

    @property
    def uses_shared_memory(self) -> bool:
        """False when the daemon's /dev/shm is out of reach and bytes travel in-stream."""
        return self.copies.shared

    def _deciding(
        self, *contexts: ContextInfo, one_stream: bool = False
    ) -> fast_path.StreamSignals | None:
        """The completion signals, if they may decide a call on work of `contexts`
        (docs/fast-path.md): not when the session is observed (tracing and checking see
        every synchronize), a capture runs (the daemon refuses the call), a model was made
        (its replays run tasks and record events the call log does not show; a call on
        `one_stream` only sees a replay as that stream's command), or a context stops on
        failure (its failure is every later call's, and a signal written clean before it
        stays clean)."""
        signals = self.signals
        if (
            signals is None
            or (signals.models and not one_stream)
            or self.capturing
            or self.observer.flags
            or any(context.stops_on_failure for context in contexts)
        ):
            return None
        return signals

    def _call(self, body: Message) -> Any:
        """Send a request and wait for its reply body (the path of every call that answers).
        A task failure it reports goes to the exception-info callbacks first."""
        try:
            return self.connection.call(body, caller_site())
        except NpuError as error:
            if error.task_seq:
                EXCEPTIONS.report(self, error)
            raise

    # ---- devices and contexts ---------------------------------------------------------------
    def _current(self) -> ContextInfo:
        context = getattr(self._local, "context", None)
        if context is None:
            raise NpuError(
                codes.ACL_ERROR_RT_CONTEXT_NULL,
                "no current context in this thread: call set_device or set_context first",
            )
        return context

    def _check_device(self, device: int) -> None:
        if not isinstance(device, int) or not 0 <= device < self.device_count:
            raise NpuError(
                codes.ACL_ERROR_RT_INVALID_DEVICEID,
                f"device {device} does not exist (device count {self.device_count})",
            )

    @records_errors
    def set_device(self, device: int) -> None:
        """aclrtSetDevice: bind the device to this thread (its default context becomes current)."""
        self._check_device(device)
        with self._lock:
            if device not in self.device_contexts:
                self.device_contexts[device] = self._new_context(device).handle
            self.device_refs[device] = self.device_refs.get(device, 0) + 1
            self._local.context = self.contexts[self.device_contexts[device]]

    @records_errors
    def reset_device(self, device: int, drop_queued: bool = False) -> None:
        """aclrtResetDevice: drop one reference; the last one waits for the device's work
        and frees its default context and streams. Blocks. `drop_queued` (an interrupted
        program): the last one discards the tasks not started yet instead of waiting."""
        self._check_device(device)
        with self._lock:
            refs = self.device_refs.get(device, 0)
            if refs == 0:
                raise invalid(f"device {device} was not set by this process")
            self.device_refs[device] = refs - 1
            release = refs == 1
            handle = self.device_contexts.pop(device) if release else None
        if handle is not None:  # the last reference was released
            self._destroy_context(handle, drop_queued)

    @records_errors
    def get_device(self) -> int:
        """aclrtGetDevice: the device of this thread's current context."""
        return self._current().device

    @records_errors
    def get_device_count(self) -> int:
        return self.device_count

    def _new_context(self, device: int) -> ContextInfo:
        reply = self._call(pb.CreateContextRequest(device=device))
        context = ContextInfo(reply.context, device, reply.default_stream)
        self.contexts[context.handle] = context
        self.stream_context[context.default_stream] = context
        if self.signals is not None and reply.HasField("signal_slot"):
            self.signals.add(context.default_stream, reply.signal_slot)
        return context

    @records_errors
    def create_context(self, device: int) -> int:
        """aclrtCreateContext: a new context on `device`, made current for this thread."""
        self._check_device(device)
        context = self._new_context(device)
        self._local.context = context
        return context.handle

    @records_errors
    def destroy_context(self, handle: int) -> None:
        """aclrtDestroyContext: waits for its streams, then frees them. Blocks."""
        self._context(handle)
        if handle in self.device_contexts.values():
            raise invalid(
                "the default context of a device is released by reset_device, not destroy_context"
            )
        self._destroy_context(handle)

    def _destroy_context(self, handle: int, drop_queued: bool = False) -> None:
        context = self.contexts.pop(handle)
        for stream in context.streams:
            self.stream_context.pop(stream, None)
            self.stream_attrs.pop(stream, None)
            self.overflow_switches.pop(stream, None)
            if self.signals is not None:
                self.signals.remove(stream)
        for event in context.events:
            self.event_context.pop(event, None)
            self.ipc_events.discard(event)
            self.unsignaled_events.discard(event)
            if self.signals is not None:
                self.signals.forget(event)
        if getattr(self._local, "context", None) is context:
            self._local.context = None
        self._call(pb.DestroyContextRequest(context=handle, drop_queued=drop_queued))

    def _context(self, handle: int) -> ContextInfo:
        context = self.contexts.get(handle)
        if context is None:
            raise bad_handle("context", handle)
        return context

    @records_errors
    def set_context(self, handle: int) -> None:
        """aclrtSetCurrentContext (per thread)."""
        self._local.context = self._context(handle)

    @records_errors
    def get_context(self) -> int:
        """aclrtGetCurrentContext."""
        return self._current().handle

    @records_errors
    def synchronize_device(self, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeDevice(WithTimeout): wait for all this process's work on the
        current device (every stream of its contexts there). Blocks; raises the first
        failure of that work. Decided on the streams' signals when they prove it."""
        wire_int(timeout_ms, "timeout_ms")
        device = self._current().device
        contexts = [c for c in list(self.contexts.values()) if c.device == device]
        signals = self._deciding(*contexts)
        if signals is not None:
            streams = [stream for context in contexts for stream in list(context.streams)]
            remaining = signals.synchronize_streams(streams, timeout_ms)
            if remaining is None:
                return
            timeout_ms = remaining
        self._call(pb.SynchronizeDeviceRequest(device=device, timeout_ms=timeout_ms))

    # ---- streams ---------------------------------------------------------------------------------
    def stream(self, handle: int) -> int:
        """The stream a call means: 0 is the current context's default stream."""
        if handle == 0 or handle is None:
            return self._current().default_stream
        if handle not in self.stream_context:
            raise bad_handle("stream", handle)
        return handle

    @records_errors
    def create_stream(self, priority: int = 0, flags: int = 0) -> int:
        """aclrtCreateStreamWithConfig: priority 0 (highest) .. 7, clamped."""
        context = self._current()
        wire_int(priority, "priority")
        wire_int(flags, "flags")
        reply = self._call(
            pb.CreateStreamRequest(context=context.handle, priority=priority, flags=flags)
        )
        handle = reply.stream
        context.streams.add(handle)
        self.stream_context[handle] = context
        self.stream_attrs[handle] = (priority, flags)
        if self.signals is not None and reply.HasField("signal_slot"):
            self.signals.add(
                handle, reply.signal_slot, fast_sync=bool(flags & codes.ACL_STREAM_FAST_SYNC)
            )
        STREAM_STATES.notify(handle, codes.ACL_RT_STREAM_STATE_CREATE_POST)
        return handle

    @records_errors
    def destroy_stream(self, handle: int, force: bool = False) -> None:
        """aclrtDestroyStream (waits for its tasks) / aclrtDestroyStreamForce (drops queued
        ones)."""
        context = self.stream_context.get(handle)
        if context is None:
            raise bad_handle("stream", handle)
        if handle == context.default_stream:
            raise invalid("the default stream cannot be destroyed")
        STREAM_STATES.notify(handle, codes.ACL_RT_STREAM_STATE_DESTROY_PRE)
        self._call(pb.DestroyStreamRequest(stream=handle, force=force))
        context.streams.discard(handle)
        self.stream_context.pop(handle, None)
        self.stream_attrs.pop(handle, None)
        self.overflow_switches.pop(handle, None)
        if self.signals is not None:
            self.signals.remove(handle)

    @records_errors
    def synchronize_stream(self, handle: int, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeStream(WithTimeout). Blocks; 507046 on timeout.

        Decided on the stream's completion signal when that can prove it (client/fast_path.py)."""
        stream = self.stream(handle)
        wire_int(timeout_ms, "timeout_ms")
        signals = self._deciding(self.stream_context[stream], one_stream=True)
        if signals is not None:
            remaining = signals.synchronize(stream, timeout_ms)
            if remaining is None:
                return
            timeout_ms = remaining
        self._call(pb.SynchronizeStreamRequest(stream=stream, timeout_ms=timeout_ms))

    @records_errors
    def stream_query(self, handle: int) -> int:
        """aclrtStreamQuery: ACL_STREAM_STATUS_COMPLETE or _NOT_READY. Complete without a
        request when the stream's signal proves it (as synchronize_stream)."""
        stream = self.stream(handle)
        signals = self._deciding(self.stream_context[stream], one_stream=True)
        if signals is not None and signals.stream_complete(stream):
            return codes.ACL_STREAM_STATUS_COMPLETE
        return self._call(pb.QueryStreamRequest(stream=stream)).status

    @records_errors
    def set_stream_failure_mode(self, handle: int, mode: int) -> None:
        """aclrtSetStreamFailureMode: STOP_ON_FAILURE stops every stream of the context."""
        wire_int(mode, "mode")
        stream = self.stream(handle)
        self._call(pb.SetStreamFailureModeRequest(stream=stream, mode=mode))
        if mode == codes.ACL_STOP_ON_FAILURE:
            self.stream_context[stream].stops_on_failure = True

    # ---- events ----------------------------------------------------------------------------------
    def _event(self, handle: int) -> int:
        if handle not in self.event_context:
            raise bad_handle("event", handle)
        return handle

    @records_errors
    def create_event(self, flags: int = 0) -> int:
        """aclrtCreateEvent / aclrtCreateEventWithFlag."""
        context = self._current()
        wire_int(flags, "flags")
        if flags & codes.ACL_EVENT_IPC and flags != codes.ACL_EVENT_IPC:
            raise invalid(f"event flags {flags:#x}: ACL_EVENT_IPC is used alone")
        handle = self._call(pb.CreateEventRequest(context=context.handle, flags=flags)).event
        context.events.add(handle)
        self.event_context[handle] = context
        if flags == codes.ACL_EVENT_IPC:
            self.ipc_events.add(handle)
        if flags & ~_SIGNALED_EVENT_FLAGS:  # the daemon treats its records in its own way
            self.unsignaled_events.add(handle)
        return handle

    @records_errors
    def destroy_event(self, handle: int) -> None:
        self._call(pb.DestroyEventRequest(event=self._event(handle)))
        self.event_context.pop(handle).events.discard(handle)
        self.ipc_events.discard(handle)
        self.unsignaled_events.discard(handle)
        if self.signals is not None:
            self.signals.forget(handle)

    @records_errors
    def record_event(self, event: int, stream: int) -> None:
        """aclrtRecordEvent (async)."""
        event, stream = self._event(event), self.stream(stream)
        seq = self.connection.send_command(
            commands.RecordEvent.pack(event, stream), caller_site(), stream
        )
        if self.signals is not None and not (
            event in self.unsignaled_events or event in self.ipc_events
        ):
            self.signals.recorded(event, stream, seq)

    @records_errors
    def reset_event(self, event: int, stream: int) -> None:
        """aclrtResetEvent (async); 207000 for an IPC event."""
        event, stream = self._event(event), self.stream(stream)
        self.not_for_ipc(event, "aclrtResetEvent")
        self.connection.send_command(commands.ResetEvent.pack(event, stream), caller_site(), stream)
        self.unsignaled_events.add(event)  # it undoes records made after it, until it runs
        if self.signals is not None:
            self.signals.forget(event)

    @records_errors
    def stream_wait_event(self, stream: int, event: int) -> None:
        """aclrtStreamWaitEvent (async): the stream waits for the event's latest record."""
        event, stream = self._event(event), self.stream(stream)
        self.connection.send_command(commands.WaitEvent.pack(event, stream), caller_site(), stream)

    @records_errors
    def query_event_status(self, event: int) -> int:
        """aclrtQueryEventStatus: ACL_EVENT_RECORDED_STATUS_COMPLETE (1) or _NOT_READY (0).
        Raises only a stopped context's failure (ACL_STOP_ON_FAILURE). Complete without a
        request when the signal of the latest record's stream proves it."""
        signals = self._event_signals(self._event(event))
        if signals is not None and signals.event_complete(event):
            return codes.ACL_EVENT_RECORDED_STATUS_COMPLETE
        reply = self._call(pb.QueryEventRequest(event=event))
        if reply.HasField("unreported_failure"):
            self._warn_unreported(reply.unreported_failure, "aclrtQueryEventStatus")
        return reply.status

    @records_errors
    def synchronize_event(self, event: int, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeEvent(WithTimeout). Blocks; 507047 on timeout. Raises only a
        stopped context's failure (ACL_STOP_ON_FAILURE); in ACL_CONTINUE_ON_FAILURE a task
        that failed before the record is reported by its stream's next synchronize, and
        this call warns about it on stderr. Decided on the signal of the latest record's
        stream when that proves it."""
        wire_int(timeout_ms, "timeout_ms")
        signals = self._event_signals(self._event(event))
        if signals is not None:
            remaining = signals.synchronize_event(event, timeout_ms)
            if remaining is None:
                return
            timeout_ms = remaining
        reply = self._call(pb.SynchronizeEventRequest(event=event, timeout_ms=timeout_ms))
        if reply is not None and reply.HasField("unreported_failure"):
            self._warn_unreported(reply.unreported_failure, "aclrtSynchronizeEvent")

    def _event_signals(self, event: int) -> fast_path.StreamSignals | None:
        """The signals, if they may decide a call on `event`: its own, of a context that does
        not stop on failure, recorded last on a stream of such a context."""
        signals = self.signals
        record = None if signals is None else signals.records.get(event)
        if record is None:
            return None
        context = self.stream_context.get(record[0])
        if context is None:
            return None
        return self._deciding(self.event_context[event], context)

    def _warn_unreported(self, failure: pb.UnreportedFailure, call: str) -> None:
        """One stderr warning for a failure an event's success does not report (ACL semantics
        keep the call's code 0): which task, where it was submitted, who will report it."""
        site = self.connection.log.site_of(failure.task_seq) or "an earlier call"
        summary = failure.message.strip().splitlines()[-1] if failure.message.strip() else ""
        reporter = (
            f"the next aclrtSynchronizeStream of stream {failure.stream:#x} or "
            "aclrtSynchronizeDevice"
            if failure.stream
            else "the next synchronize of any stream or of the device"
        )
        sys.stderr.write(
            f"simnpu: warning: {call} returned success (ACL_CONTINUE_ON_FAILURE), but task "
            f"{failure.task_seq} submitted at {site} before the event's record failed with "
            f"{failure.code}: {summary}\n"
            f"simnpu: the failure will be reported by {reporter}; results after it may be "
            "wrong. Synchronize the stream, or set ACL_STOP_ON_FAILURE to have event calls "
            "report it.\n"
        )

    @records_errors
    def event_elapsed_time(self, start: int, end: int) -> float:
        """aclrtEventElapsedTime: milliseconds between two completed records (device clock)."""
        reply = self._call(
            pb.EventElapsedTimeRequest(start=self._event(start), end=self._event(end))
        )
        return reply.nanoseconds / 1e6

    # ---- device memory --------------------------------------------------------------------------
    @records_errors
    def malloc(self, size: int, policy: int = codes.ACL_MEM_MALLOC_HUGE_FIRST) -> int:
        """aclrtMalloc on the current device: a device address (not dereferenceable here)."""
        if not isinstance(size, int) or size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size!r} bytes")
        check_allocatable(size, "device memory", padded=True)
        wire_int(policy, "policy")
        device = self._current().device
        address = self._call(pb.MallocRequest(device=device, size=size, policy=policy)).address
        self._remember(address, size, device)
        return address

    def device_range(self, address: int, count: int) -> None:
        """Check [address, address+count) lies in one allocation of this process, or in its
        mapped memory (107000; 507053 where a reserved range has nothing mapped)."""
        index = bisect.bisect_right(self.allocation_starts, address) - 1
        if index >= 0:
            start = self.allocation_starts[index]
            size = self.allocations[start][0]
            if address + count <= start + size:
                return
            if address < start + size:
                raise invalid(
                    f"{count} bytes at {address:#x} run past the end of the allocation "
                    f"[{start:#x}, +{size})"
                )
        if self.mapped_range(address, count) or self.registered_range(address, count):
            return
        raise invalid(f"{address:#x} is not inside a device allocation of this process")

    # ---- pinned host memory ----------------------------------------------------------------------
    @records_errors
    def malloc_host(self, size: int) -> int:
        """aclrtMallocHost: page-locked host memory; the address is usable with ctypes/numpy."""
        if not isinstance(size, int) or size <= 0:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size!r} bytes of host memory"
            )
        check_allocatable(size, "pinned host memory")
        if not self.copies.shared:
            return self.host.add_private(0, size).address
        reply = self._call(pb.MallocHostRequest(size=size))
        return self.host.add_shared(reply.segment, size, reply.name).address

    @records_errors
    def free_host(self, address: int) -> None:
        """aclrtFreeHost."""
        if not address:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to free_host")
        block = self.host.find(address)
        if block is None or block.address != address:
            raise invalid(f"{address:#x} is not the start of pinned host memory of this process")
        if self.is_managed(address):
            raise invalid(f"{address:#x} is managed memory: free it with aclrtFree")
        self.unregister_block(address, block.size)  # its registrations go with it
        self.host.remove(address)
        if block.region is not None:
            self._call(pb.FreeHostRequest(segment=block.handle))
            try:
                block.region.close()
            except BufferError:  # numpy views still alive: the mapping goes when they do
                pass

    # ---- copies ----------------------------------------------------------------------------------
    @records_errors
    def memcpy(self, dst: int, dest_max: int, src: int, count: int, kind: int) -> None:
        """aclrtMemcpy: synchronous, not ordered with any stream; 107030 where a stream
        capture's mode refuses it. Blocks."""
        self.capture_modes.check("aclrtMemcpy")
        self.copies.copy(dst, dest_max, src, count, kind, None)

    @records_errors
    def memcpy_async(
        self, dst: int, dest_max: int, src: int, count: int, kind: int, stream: int
    ) -> None:
        """aclrtMemcpyAsync: stream-ordered; async from pinned memory, blocking from pageable."""
        self.copies.copy(dst, dest_max, src, count, kind, self.stream(stream))

    @records_errors
    def memset(self, dst: int, dest_max: int, value: int, count: int) -> None:
        """aclrtMemset: synchronous byte fill; 107030 where a stream capture's mode refuses
        it. Blocks."""
        self.capture_modes.check("aclrtMemset")
        self.copies.fill(dst, dest_max, value, count, None)

    @records_errors
    def memset_async(self, dst: int, dest_max: int, value: int, count: int, stream: int) -> None:
        """aclrtMemsetAsync (async for device memory)."""
        self.copies.fill(dst, dest_max, value, count, self.stream(stream))

    # ---- kernels ---------------------------------------------------------------------------------
    @records_errors
    def binary_load(self, source: str, filename: str = "<kernel module>") -> int:
        """aclrtBinaryLoadFromFile/FromData: the source of a Python kernel module."""
        handle = self._call(pb.BinaryLoadRequest(source=source, filename=filename)).binary
        self.binaries.add(handle)
        return handle

    @records_errors
    def binary_unload(self, binary: int) -> None:
        """aclrtBinaryUnLoad: its functions become invalid handles."""
        if binary not in self.binaries:
            raise bad_handle("binary", binary)
        self._call(pb.BinaryUnloadRequest(binary=binary))
        self.binaries.discard(binary)
        for function in [f for f, b in self.function_binary.items() if b == binary]:
            del self.function_binary[function]
            self.functions.pop(function, None)

    @records_errors
    def get_function(self, binary: int, name: str) -> int:
        """aclrtBinaryGetFunction: a kernel of the binary, by name."""
        if binary not in self.binaries:
            raise bad_handle("binary", binary)
        from simnpu.proto.kernel_abi import KernelSignature

        reply = self._call(pb.GetFunctionRequest(binary=binary, name=name))
        self.functions[reply.function] = KernelSignature.from_wire(reply.signature)
        self.function_binary[reply.function] = binary
        return reply.function

    def signature(self, function: int) -> KernelSignature:
        signature = self.functions.get(function)
        if signature is None:
            raise bad_handle("function", function)
        return signature

    @records_errors
    def launch_kernel_with_host_args(
        self,
        function: int,
        num_blocks: int,
        stream: int,
        cfg,
        host_args_ptr: int,
        args_size: int,
        place_holders=None,
        place_holder_num: int = 0,
    ) -> None:
        """aclrtLaunchKernelWithHostArgs (async), as pyACL passes it: the packed argument
        struct lies in host memory at host_args_ptr and is copied before the call returns."""
        signature = self.functions.get(function)
        if (  # a launch every check below would pass: straight to the ring
            signature is not None
            and 0 < num_blocks <= codes.MAX_NUM_BLOCKS
            and args_size >= signature.end
            and host_args_ptr < DEVICE_BASE
            and stream in self.stream_context
            and not (cfg or place_holders or place_holder_num)
        ):
            end = signature.end
            args_type = _HOST_ARGS.get(end) or _host_args_type(None, None, 0, 0, end)
            args = args_type.from_address(host_args_ptr).raw
            self.send_launch(commands.Launch.pack(num_blocks, stream, function, args), stream)
            return
        struct_type = _HOST_ARGS.get(args_size)
        if (
            cfg
            or place_holders
            or place_holder_num
            or host_args_ptr >= DEVICE_BASE
            or struct_type is None
        ):
            struct_type = _host_args_type(
                cfg, place_holders, place_holder_num, host_args_ptr, args_size
            )
        self._launch(function, num_blocks, struct_type.from_address(host_args_ptr).raw, stream)

    @records_errors
    def launch_kernel(self, function: int, num_blocks: int, args: bytes, stream: int) -> None:
        """aclrtLaunchKernelWithHostArgs (async): `args` is the packed parameter buffer."""
        self._launch(function, num_blocks, args, stream)

    def _launch(self, function: int, num_blocks: int, args: bytes, stream: int) -> None:
        signature = self.signature(function)
        check_num_blocks(num_blocks)
        if len(args) < signature.end:
            raise invalid(
                f"argument buffer of {len(args)} bytes is shorter than the {signature.end} "
                f"bytes the kernel's parameters ({signature.to_wire()}) need"
            )
        stream = self.stream(stream)
        args = bytes(args)[: signature.end]  # only what the parameters take: all the daemon reads
        self.send_launch(commands.Launch.pack(num_blocks, stream, function, args), stream)

    @records_errors
    def launch_kernel_devargs(
        self, function: int, num_blocks: int, args_ptr: int, args_size: int, stream: int
    ) -> None:
        """aclrtLaunchKernel (async): the parameter buffer lies in device memory."""
        signature = self.signature(function)
        check_num_blocks(num_blocks)
        if args_size < signature.end:
            raise invalid(
                f"argument buffer of {args_size} bytes is shorter than "
                f"the {signature.end} bytes needed"
            )
        self.device_range(args_ptr, args_size)
        stream = self.stream(stream)
        self.send_launch(
            commands.LaunchDeviceArgs.pack(num_blocks, stream, function, args_ptr, args_size),
            stream,
        )

    @records_errors
    def launch_kernel_with_config(
        self, function: int, num_blocks: int, stream: int, cfg, args_handle: int, reserve: int
    ) -> None:
        """aclrtLaunchKernelWithConfig (async): the arguments of a finalized kernel-args
        handle (client/kernel_args.py), with the launch attributes of `cfg`."""
        record, stream = self.kernel_args.launch(
            function, num_blocks, stream, cfg, args_handle, reserve
        )
        self.send_launch(record, stream)

    @records_errors
    def set_op_execute_timeout(self, milliseconds: int) -> None:
        """aclrtSetOpExecuteTimeOutWithMs: 0 restores the daemon's default."""
        wire_int(milliseconds, "milliseconds")
        self._call(pb.SetOpExecuteTimeoutRequest(milliseconds=milliseconds))

    # ---- host callbacks --------------------------------------------------------------------------
    def _callback_arrived(self, callback: int) -> None:
        self.callbacks.arrived(callback)

    @records_errors
    def subscribe_report(self, thread_id: int, stream: int) -> None:
        """aclrtSubscribeReport: thread `thread_id` runs the stream's callbacks (process_report)."""
        self.callbacks.subscribe(thread_id, self.stream(stream))

    @records_errors
    def unsubscribe_report(self, thread_id: int, stream: int) -> None:
        """aclrtUnSubscribeReport."""
        self.callbacks.unsubscribe(thread_id, self.stream(stream))

    @records_errors
    def launch_callback(self, function, data, block_type: int, stream: int) -> None:
        """aclrtLaunchCallback (async): ACL_CALLBACK_BLOCK holds the stream until it returns."""
        if block_type not in (codes.ACL_CALLBACK_NO_BLOCK, codes.ACL_CALLBACK_BLOCK):
            raise invalid(f"unknown callback block type {block_type}")
        self.callbacks.launch_callback(
            function, data, block_type == codes.ACL_CALLBACK_BLOCK, self.stream(stream)
        )

    @records_errors
    def process_report(self, timeout_ms: int = -1) -> None:
        """aclrtProcessReport: run one callback of this thread's streams. Blocks."""
        self.callbacks.process_report(timeout_ms)

    @records_errors
    def subscribe_host_func(self, thread_id: int, stream: int) -> None:
        """aclrtSubscribeHostFunc: thread `thread_id` runs the stream's host functions."""
        self.callbacks.subscribe_host_func(thread_id, self.stream(stream))

    @records_errors
    def unsubscribe_host_func(self, thread_id: int, stream: int) -> None:
        """aclrtUnSubscribeHostFunc: the runtime's own thread runs them again."""
        self.callbacks.unsubscribe_host_func(thread_id, self.stream(stream))

    @records_errors
    def process_host_func(self, timeout_ms: int = -1) -> None:
        """aclrtProcessHostFunc: run one host function of this thread's streams. Blocks."""
        self.callbacks.process_host_func(timeout_ms)

    @records_errors
    def launch_host_func(self, stream: int, function, data) -> None:
        """aclrtLaunchHostFunc (async): function(data) runs in stream order on a runtime thread."""
        self.callbacks.launch_host_func(function, data, self.stream(stream))

    # ---- errors and the end ----------------------------------------------------------------------
    def get_last_error(self) -> int:
        """aclrtGetLastError: this thread's last error code, cleared."""
        return last_error.code(clear=True)

    def peek_at_last_error(self) -> int:
        """aclrtPeekAtLastError: the same, not cleared."""
        return last_error.code(clear=False)

    def close(self) -> None:
        """End the session; the daemon frees whatever this process still owns."""
        self.observer.finish()  # trace and report files, while the session is still there
        for block in self.host.blocks():
            if block.region is not None:
                try:
                    block.region.close()
                except BufferError:
                    pass
        self.copies.close()
        self.connection.close()
        fast_path, self.fast_path, self.signals = self.fast_path, None, None
        if fast_path is not None:
            fast_path.close()


# event flags whose records the daemon treats as a plain event's (signals may decide them)
_SIGNALED_EVENT_FLAGS = codes.ACL_EVENT_SYNC | codes.ACL_EVENT_TIME_LINE
_HOST_ARGS: dict[int, type[ctypes.Array]] = {}  # argument-struct size -> ctypes array type


def _host_args_type(
    cfg, place_holders, place_holder_num: int, host_args_ptr: int, args_size: int
) -> type[ctypes.Array]:
    """The slow path of launch_kernel_with_host_args: what it refuses, and a ctypes array type
    for a struct size not seen yet (string_at would cost twice as much on every launch)."""
    if cfg:
        raise NotSupportedError("aclrtLaunchKernelWithHostArgs launch attributes (cfg)")
    if place_holders or place_holder_num:
        raise NotSupportedError("aclrtLaunchKernelWithHostArgs place holders")
    if host_args_ptr >= DEVICE_BASE:
        raise invalid(
            f"host_args_ptr {host_args_ptr:#x} is a device address: launch_kernel takes "
            "arguments in device memory, launch_kernel_with_host_args in host memory"
        )
    if args_size < 0:
        raise invalid(f"args_size {args_size} is negative")
    struct_type = ctypes.c_char * args_size
    if len(_HOST_ARGS) < 256:
        _HOST_ARGS[args_size] = struct_type
    return struct_type


def _attach_staging(name: str, size: int, probe: bytes) -> Region | None:
    """Map the session's staging area if this process shares the daemon's /dev/shm
    (checked with the probe bytes, not just the name); None means in-stream copies."""
    if os.environ.get("SIMNPU_NO_SHM") == "1":
        return None
    try:
        region = Region.attach(name)
    except Exception:
        return None
    if region.size < size + len(probe) or bytes(region.map[size : size + len(probe)]) != probe:
        region.close()
        return None
    return region
