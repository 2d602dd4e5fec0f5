"""rt.streams: stream calls -- create and destroy, attributes and the overflow switch,
failure mode, abort and stop, resource limits, the stream whose limits a thread uses.

A stream's id is the number in its handle (as the daemon's timeline names it); its priority
and flags are the ones it was created with (its record: client/runtime/contexts.py). Stream
config handles (aclrtCreateStreamConfigHandle) are host structs, the process's: plain ints
here.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

from simnpu.client.last_error import records_errors
from simnpu.client.runtime.arguments import wire_int
from simnpu.client.stream_states import STREAM_STATES
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, bad_handle, invalid

if TYPE_CHECKING:
    from simnpu.client.runtime.shared import Shared

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
LIMIT_TYPES = (codes.ACL_RT_DEV_RES_CUBE_CORE, codes.ACL_RT_DEV_RES_VECTOR_CORE)


def check_limit_type(kind: int) -> None:
    """107000 for a resource type other than ACL_RT_DEV_RES_CUBE_CORE or _VECTOR_CORE."""
    if kind not in LIMIT_TYPES:
        raise NpuError(
            codes.ACL_ERROR_RT_PARAM_INVALID,
            f"resource type {kind}: use ACL_RT_DEV_RES_CUBE_CORE (0) or "
            "ACL_RT_DEV_RES_VECTOR_CORE (1)",
        )


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


class ThreadLimits:
    """The stream whose limits each thread uses (aclrtUseStreamResInCurrentThread). The
    kernels part reads it at every launch: `used` stays False until a thread ever chose a
    stream, so that launches skip the thread-local lookup until then."""

    __slots__ = ("_local", "used")

    def __init__(self) -> None:
        self._local = threading.local()  # .stream: the stream this thread uses, or None
        self.used = False

    def stream(self) -> int | None:
        """The stream whose limits this thread uses, if any."""
        return getattr(self._local, "stream", None)

    def use(self, stream: int | None) -> None:
        self._local.stream = stream
        if stream is not None:
            self.used = True


class Streams:
    """Stream calls (see the module docstring)."""

    def __init__(self, shared: Shared, limits: ThreadLimits):
        self._calls, self._contexts = shared.calls, shared.contexts
        self._log = shared.connection.log
        self._limits = limits

    # ---- creating and destroying --------------------------------------------------------------
    @records_errors
    def create_stream(self, priority: int = 0, flags: int = 0, site: str | None = None) -> int:
        """aclrtCreateStreamWithConfig: priority 0 (highest) .. 7, clamped. Blocks."""
        context = self._contexts.current()
        wire_int(priority, "priority")
        wire_int(flags, "flags")
        reply = self._calls.request(
            pb.CreateStreamRequest(context=context.handle, priority=priority, flags=flags), site
        )
        self._contexts.add_stream(context, reply.stream, priority, flags, reply)
        STREAM_STATES.notify(reply.stream, codes.ACL_RT_STREAM_STATE_CREATE_POST)
        return reply.stream

    @records_errors
    def create_stream_v2(self, config_handle: int, site: str | None = None) -> int:
        """aclrtCreateStreamV2: a stream with the config handle's priority (clamped to 0..7)
        and flags; its work memory fields change nothing here. Blocks."""
        config = STREAM_CONFIGS.get(config_handle)
        priority = min(config["priority"] & _ID_MASK, codes.STREAM_PRIORITY_LEAST)
        return self.create_stream(priority, config["flag"] & _ID_MASK, site)

    @records_errors
    def destroy_stream(self, handle: int, force: bool = False, site: str | None = None) -> None:
        """aclrtDestroyStream (waits for its tasks) / aclrtDestroyStreamForce (drops queued
        ones). Blocks."""
        record = self._contexts.streams.get(handle)
        if record is None:
            raise bad_handle("stream", handle)
        if handle == record.context.default_stream:
            raise invalid("the default stream cannot be destroyed")
        STREAM_STATES.notify(handle, codes.ACL_RT_STREAM_STATE_DESTROY_PRE)
        self._calls.request(pb.DestroyStreamRequest(stream=handle, force=force), site)
        self._contexts.drop_stream(record)

    @records_errors
    def set_stream_failure_mode(self, handle: int, mode: int, site: str | None = None) -> None:
        """aclrtSetStreamFailureMode: STOP_ON_FAILURE stops every stream of the context.
        Blocks."""
        wire_int(mode, "mode")
        record = self._contexts.stream_record(handle)
        self._calls.request(pb.SetStreamFailureModeRequest(stream=record.handle, mode=mode), site)
        if mode == codes.ACL_STOP_ON_FAILURE:
            record.context.stops_on_failure = True

    # ---- attributes ----------------------------------------------------------------------------
    @records_errors
    def stream_get_id(self, handle: int) -> int:
        """aclrtStreamGetId: the number in the stream's handle."""
        return self._contexts.stream(handle) & _ID_MASK

    @records_errors
    def stream_get_priority(self, handle: int) -> int:
        """aclrtStreamGetPriority: 0 (highest) .. 7, as created (clamped)."""
        return self._contexts.stream_record(handle).priority

    @records_errors
    def stream_get_flags(self, handle: int) -> int:
        """aclrtStreamGetFlags: the ACL_STREAM_* flags it was created with."""
        return self._contexts.stream_record(handle).flags & _STREAM_FLAGS

    @records_errors
    def set_stream_overflow_switch(self, stream: int, flag: int) -> None:
        """aclrtSetStreamOverflowSwitch: 0 or 1 (else 100000, before the stream is looked at)."""
        if flag not in (0, 1):
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"overflow switch {flag}: use 0 or 1")
        self._contexts.stream_record(stream).overflow_switch = flag

    @records_errors
    def get_stream_overflow_switch(self, stream: int) -> int:
        """aclrtGetStreamOverflowSwitch: 0 until set."""
        return self._contexts.stream_record(stream).overflow_switch

    # ---- ending a stream's work ------------------------------------------------------------------
    @records_errors
    def stream_abort(self, stream: int, site: str | None = None) -> None:
        """aclrtStreamAbort: end the stream's running work and discard its queued tasks (0:
        the current context's default stream). Blocks until done."""
        self._calls.request(pb.StreamAbortRequest(stream=self._contexts.stream(stream)), site)

    @records_errors
    def stream_stop(self, stream: int, site: str | None = None) -> None:
        """aclrtStreamStop: end the stream's running work; its queued tasks run next. The
        default stream (0) is not taken (107000). Blocks until done."""
        if not stream:
            raise invalid("aclrtStreamStop takes no default stream (stream is null)")
        self._calls.request(
            pb.StreamAbortRequest(stream=self._contexts.stream(stream), stop=True), site
        )

    # ---- resource limits -----------------------------------------------------------------------
    @records_errors
    def get_stream_res_limit(self, stream: int, kind: int, site: str | None = None) -> int:
        """aclrtGetStreamResLimit: the stream's own limit, else its process's on the device,
        else every AI core. Blocks."""
        check_limit_type(kind)
        reply = self._calls.request(
            pb.StreamResLimitRequest(stream=self._contexts.stream(stream)), site
        )
        return reply.cube_limit if kind == codes.ACL_RT_DEV_RES_CUBE_CORE else reply.vector_limit

    @records_errors
    def set_stream_res_limit(
        self, stream: int, kind: int, value: int, site: str | None = None
    ) -> None:
        """aclrtSetStreamResLimit: the stream's kernels run on at most `value` AI cores (the
        smaller of its cube and vector limits in force). Blocks."""
        handle = self._contexts.stream(stream)
        check_limit_type(kind)
        wire_int(value, "value")
        self._calls.request(pb.StreamResLimitRequest(stream=handle, type=kind, value=value), site)

    @records_errors
    def reset_stream_res_limit(self, stream: int, site: str | None = None) -> None:
        """aclrtResetStreamResLimit: the stream follows its process's limits again. Blocks."""
        self._calls.request(
            pb.StreamResLimitRequest(stream=self._contexts.stream(stream), reset=True), site
        )

    @records_errors
    def use_stream_res_in_current_thread(self, stream: int) -> None:
        """aclrtUseStreamResInCurrentThread: aclrtGetResInCurrentThread on this thread reads
        the stream's limits (the last stream set wins), and its launches on any stream are
        bounded by that stream's core limit."""
        self._limits.use(self._contexts.stream(stream))

    @records_errors
    def unuse_stream_res_in_current_thread(self, stream: int) -> None:
        """aclrtUnuseStreamResInCurrentThread: this thread reads its process's limits again."""
        if self._limits.stream() == self._contexts.stream(stream):
            self._limits.use(None)

    def thread_res_stream(self) -> int | None:
        """The stream whose limits this thread uses (aclrtUseStreamResInCurrentThread), if
        it still exists."""
        stream = self._limits.stream()
        return stream if stream in self._contexts.streams else None

    # ---- tasks ---------------------------------------------------------------------------------
    @records_errors
    def get_thread_last_task_id(self) -> int:
        """aclrtGetThreadLastTaskId: the task number of this thread's last asynchronous call
        (0 before its first)."""
        return self._log.last_command_of_thread(threading.get_ident()) & _ID_MASK
