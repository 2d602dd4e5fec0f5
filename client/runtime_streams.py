"""The raw layer's stream and event calls beyond the basics, and the error calls that read
exception infos: a mixin of Runtime (client/runtime.py), which sets the state it uses.

A stream's id is the number in its handle (as the daemon's timeline names it); its priority
and flags are the ones it was created with. Stream config handles (aclrtCreateStreamConfigHandle)
are host structs, the process's: plain ints here.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

from simnpu.client.exceptions import EXCEPTIONS
from simnpu.client.last_error import records_errors
from simnpu.client.runtime_memory import wire_int
from simnpu.client.transport import caller_site
from simnpu.proto import codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.capture_modes import CaptureModes
    from simnpu.client.runtime import ContextInfo
    from simnpu.client.transport import Connection

_ID_MASK = 0xFFFFFFFF
_STREAM_FLAGS = (
    codes.ACL_STREAM_FAST_LAUNCH
    | codes.ACL_STREAM_FAST_SYNC
    | codes.ACL_STREAM_PERSISTENT
    | codes.ACL_STREAM_HUGE
    | codes.ACL_STREAM_CPU_SCHEDULE
    | codes.ACL_STREAM_DEVICE_USE_ONLY
)
_CONFIG_FIELDS = {
    codes.ACL_RT_STREAM_WORK_ADDR_PTR: "work_ptr",
    codes.ACL_RT_STREAM_WORK_SIZE: "work_size",
    codes.ACL_RT_STREAM_FLAG: "flag",
    codes.ACL_RT_STREAM_PRIORITY: "priority",
}


class StreamConfigs:
    """aclrtStreamConfigHandle structs of this process: handle -> fields (all 0 at first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles = itertools.count(1)
        self._configs: dict[int, dict[str, int]] = {}

    def create(self) -> int:
        with self._lock:
            handle = next(self._handles)
            self._configs[handle] = dict.fromkeys(_CONFIG_FIELDS.values(), 0)
            return handle

    def get(self, handle: int) -> dict[str, int]:
        """The fields of `handle`; a null or unknown one is ACL's null-pointer error (100000)."""
        config = self._configs.get(handle)
        if config is None:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"stream config handle {handle:#x} is null or not one of this process",
            )
        return config

    def set(self, handle: int, attr: int, value: object) -> None:
        """aclrtSetStreamConfigOpt: 100000 for another attribute or a value that is not an
        unsigned int."""
        config = self.get(handle)
        field = _CONFIG_FIELDS.get(attr)
        if field is None:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"attr {attr}: no aclrtStreamConfigAttr")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"value {value!r}: an unsigned int is expected"
            )
        config[field] = value

    def destroy(self, handle: int) -> None:
        with self._lock:
            self.get(handle)
            del self._configs[handle]


STREAM_CONFIGS = StreamConfigs()


class RuntimeStreams:
    # what the mixin uses of Runtime (client/runtime.py), which sets and defines all of it
    connection: Connection
    device_count: int
    stream_attrs: dict[int, tuple[int, int]]  # stream -> (priority, flags) it was created with
    stream_context: dict[int, Any]  # stream -> its context
    capture_modes: CaptureModes  # the streams this process captures (client/runtime_graphs.py)
    _thread_res: threading.local  # .stream: the stream whose limits this thread uses
    _thread_res_used: bool  # whether any thread ever did (launches skip the lookup until then)

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _check_device(self, device: int) -> None: ...
        def _event(self, handle: int) -> int: ...
        def _current(self) -> ContextInfo: ...
        def stream(self, handle: int) -> int: ...
        def create_stream(self, priority: int = 0, flags: int = 0) -> int: ...
        def record_event(self, event: int, stream: int) -> None: ...
        def stream_wait_event(self, stream: int, event: int) -> None: ...
        def _limit_type(self, kind: int) -> None: ...

    # ---- streams -------------------------------------------------------------------------------
    @records_errors
    def create_stream_v2(self, config_handle: int) -> int:
        """aclrtCreateStreamV2: a stream with the config handle's priority (clamped to 0..7)
        and flags; its work memory fields change nothing here."""
        config = STREAM_CONFIGS.get(config_handle)
        priority = min(config["priority"] & _ID_MASK, codes.STREAM_PRIORITY_LEAST)
        return self.create_stream(priority, config["flag"] & _ID_MASK)

    @records_errors
    def stream_get_id(self, handle: int) -> int:
        """aclrtStreamGetId: the number in the stream's handle."""
        return self.stream(handle) & _ID_MASK

    @records_errors
    def stream_get_priority(self, handle: int) -> int:
        """aclrtStreamGetPriority: 0 (highest) .. 7, as created (clamped)."""
        return self.stream_attrs.get(self.stream(handle), (0, 0))[0]

    @records_errors
    def stream_get_flags(self, handle: int) -> int:
        """aclrtStreamGetFlags: the ACL_STREAM_* flags it was created with."""
        return self.stream_attrs.get(self.stream(handle), (0, 0))[1] & _STREAM_FLAGS

    # ---- ending a stream's work ------------------------------------------------------------------
    @records_errors
    def stream_abort(self, stream: int) -> None:
        """aclrtStreamAbort: end the stream's running work and discard its queued tasks (0:
        the current context's default stream). Blocks until done."""
        self._call(pb.StreamAbortRequest(stream=self.stream(stream)))

    @records_errors
    def stream_stop(self, stream: int) -> None:
        """aclrtStreamStop: end the stream's running work; its queued tasks run next. The
        default stream (0) is not taken (107000). Blocks until done."""
        if not stream:
            raise invalid("aclrtStreamStop takes no default stream (stream is null)")
        self._call(pb.StreamAbortRequest(stream=self.stream(stream), stop=True))

    # ---- stream resource limits --------------------------------------------------------------
    @records_errors
    def get_stream_res_limit(self, stream: int, kind: int) -> int:
        """aclrtGetStreamResLimit: the stream's own limit, else its process's on the device,
        else every AI core. Blocks."""
        self._limit_type(kind)
        reply = self._call(pb.StreamResLimitRequest(stream=self.stream(stream)))
        return reply.cube_limit if kind == codes.ACL_RT_DEV_RES_CUBE_CORE else reply.vector_limit

    @records_errors
    def set_stream_res_limit(self, stream: int, kind: int, value: int) -> None:
        """aclrtSetStreamResLimit: the stream's kernels run on at most `value` AI cores (the
        smaller of its cube and vector limits in force). Blocks."""
        handle = self.stream(stream)
        self._limit_type(kind)
        wire_int(value, "value")
        self._call(pb.StreamResLimitRequest(stream=handle, type=kind, value=value))

    @records_errors
    def reset_stream_res_limit(self, stream: int) -> None:
        """aclrtResetStreamResLimit: the stream follows its process's limits again. Blocks."""
        self._call(pb.StreamResLimitRequest(stream=self.stream(stream), reset=True))

    @records_errors
    def use_stream_res_in_current_thread(self, stream: int) -> None:
        """aclrtUseStreamResInCurrentThread: aclrtGetResInCurrentThread on this thread reads
        the stream's limits (the last stream set wins), and its launches on any stream are
        bounded by that stream's core limit."""
        self._thread_res.stream = self.stream(stream)
        self._thread_res_used = True

    @records_errors
    def unuse_stream_res_in_current_thread(self, stream: int) -> None:
        """aclrtUnuseStreamResInCurrentThread: this thread reads its process's limits again."""
        if getattr(self._thread_res, "stream", None) == self.stream(stream):
            self._thread_res.stream = None

    def send_launch(self, record: bytes, stream: int) -> None:
        """Send a launch's record; from a thread that uses another stream's limits, as a
        ThreadLimited record: that stream's core limit bounds it. Called by the runtime's
        launch methods only (the call site is looked for above them)."""
        if self._thread_res_used:
            limits = getattr(self._thread_res, "stream", None)
            if limits is not None and limits != stream and limits in self.stream_context:
                record = commands.ThreadLimited.pack(limits, record)
        self.connection.send_command(record, caller_site(3), stream)  # our caller is ours

    def thread_res_stream(self) -> int | None:
        """The stream whose limits this thread uses (aclrtUseStreamResInCurrentThread), if
        it still exists."""
        stream = getattr(self._thread_res, "stream", None)
        return stream if stream in self.stream_context else None

    # ---- events --------------------------------------------------------------------------------
    @records_errors
    def record_event_with_flag(self, event: int, stream: int, flag: int) -> None:
        """aclrtRecordEventWithFlag (async): ACL_EVENT_RECORD_DEFAULT records as
        aclrtRecordEvent; ACL_EVENT_RECORD_EXTERNAL records into the model a stream this
        process began capturing records into (else 107029), seen outside it at each replay."""
        if not event:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "event is null")
        if flag == codes.ACL_EVENT_RECORD_DEFAULT:
            self.record_event(event, stream)
            return
        if flag != codes.ACL_EVENT_RECORD_EXTERNAL:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"flag {flag}: use ACL_EVENT_RECORD_DEFAULT or ACL_EVENT_RECORD_EXTERNAL",
            )
        self._event(event)
        if not self.capture_modes.capturing(self.stream(stream)):
            raise _not_captured("record")
        self.record_event(event, stream)  # a graph's records are seen outside it anyway

    @records_errors
    def stream_wait_event_with_flag(self, stream: int, event: int, timeout: int, flag: int) -> None:
        """aclrtStreamWaitEventWithFlag (async): ACL_EVENT_WAIT_DEFAULT waits as
        aclrtStreamWaitEventWithTimeout; ACL_EVENT_WAIT_EXTERNAL (timeout 0 only) waits
        inside the model a stream this process began capturing records into (else 107029),
        each replay for the event's latest record when it is submitted."""
        if not event:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "event is null")
        if flag == codes.ACL_EVENT_WAIT_DEFAULT:
            self.stream_wait_event_with_timeout(stream, event, _as_int32(timeout))
            return
        if flag != codes.ACL_EVENT_WAIT_EXTERNAL:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"flag {flag}: use ACL_EVENT_WAIT_DEFAULT or ACL_EVENT_WAIT_EXTERNAL",
            )
        if timeout:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"timeout {timeout}: ACL_EVENT_WAIT_EXTERNAL takes timeout 0 only",
            )
        self._event(event)
        if not self.capture_modes.capturing(self.stream(stream)):
            raise _not_captured("wait")
        self.stream_wait_event(stream, event)  # a replay binds it to the latest record then

    @records_errors
    def stream_wait_event_with_timeout(self, stream: int, event: int, timeout: int) -> None:
        """aclrtStreamWaitEventWithTimeout (async): timeout in seconds, 0 never times out; a
        wait whose event has not completed in time fails with 107019 at the stream's next
        synchronize, and the stream goes on."""
        if timeout < 0:
            raise invalid(f"timeout {timeout}: use 0 (never) or a number of seconds")
        if not timeout:
            self.stream_wait_event(stream, event)
            return
        event, stream = self._event(event), self.stream(stream)
        self.connection.send_command(
            commands.WaitEventTimeout.pack(event, stream, timeout), caller_site(), stream
        )

    @records_errors
    def event_get_timestamp(self, event: int) -> int:
        """aclrtEventGetTimestamp: microseconds since the host system started (the device
        clock) at which the event's latest record ran. Blocks."""
        if not event:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "event is null")
        return self._call(pb.EventTimestampRequest(event=self._event(event))).microseconds

    # ---- tasks and errors ----------------------------------------------------------------------
    @records_errors
    def get_thread_last_task_id(self) -> int:
        """aclrtGetThreadLastTaskId: the task number of this thread's last asynchronous call
        (0 before its first)."""
        return self.connection.log.thread_seq.get(threading.get_ident(), 0) & _ID_MASK

    @records_errors
    def get_error_verbose(self, device: int) -> dict:
        """aclrtGetErrorVerbose: ACL_RT_ERROR_AICORE (a software error, ACL_RT_AICORE_ERROR_SW)
        once a kernel of this process failed on the device, else ACL_RT_NO_ERROR; the
        simulated device has no memory (UCE) or link faults to repair."""
        wire_int(device, "device")
        self._check_device(device)
        failed = device in EXCEPTIONS.kernel_failed
        return {
            "try_repair": 0,
            "has_detail": int(failed),
            "reserved": [0, 0],
            "error_type": codes.ACL_RT_ERROR_AICORE if failed else codes.ACL_RT_NO_ERROR,
            "detail": {
                "uce_info": {"array_size": 0, "mem_uce_info_array": []},
                "aicore_err_type": (
                    codes.ACL_RT_AICORE_ERROR_SW if failed else codes.ACL_RT_AICORE_ERROR_UNKNOWN
                ),
            },
        }


def _as_int32(value: int) -> int:
    """A uint32 as the int32 the runtime passes it on as."""
    value &= _ID_MASK
    return value - (1 << 32) if value >= 1 << 31 else value


def _not_captured(what: str) -> NpuError:
    return NpuError(
        codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED,
        f"an external event {what} belongs in a stream being captured into a model "
        "(aclmdlRICaptureBegin), and this stream is not",
    )
