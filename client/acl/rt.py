"""acl.rt: the AscendCL runtime calls, with pyACL's signatures and return shapes.

Every function returns the ACL return code last: `ret`, `(value, ret)` or `(v1, v2, ret)`;
handles and pointers are ints; stream 0 is the current context's default stream. Wrong
Python argument types raise TypeError (as pyACL's argument parsing does); nothing raises
for an ACL-level error. Calls marked "async" return at once; the rest block.

The pyACL calls simnpu does not simulate are listed in rt_unsupported.py and made at the
end of this module: each returns ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000) and says why in
acl.get_recent_err_msg().
"""

from __future__ import annotations

import os
import struct

from simnpu.client import last_error as _last_error
from simnpu.client.facade import api, not_supported
from simnpu.client.facade import on_demand as _on_demand
from simnpu.proto import codes
from simnpu.proto.errors import NpuError as _NpuError
from simnpu.shm.addresses import DEVICE_BASE

from . import rt_builtin_tasks as _builtin_tasks
from . import rt_cnt_notify as _cnt_notify
from . import rt_devices as _devices
from . import rt_exceptions as _exceptions
from . import rt_flow as _flow
from . import rt_host_memory as _host_memory
from . import rt_ipc_events as _ipc_events
from . import rt_kernel_args as _kernel_args
from . import rt_memory as _memory
from . import rt_notify as _notify
from . import rt_overflow as _overflow
from . import rt_peers as _peers
from . import rt_streams as _streams
from . import rt_unsupported as _more
from . import rt_values as _values
from . import rt_vmm as _vmm

_FLOAT = struct.Struct("<f")

_U32 = 0xFFFFFFFF
_DEVICE_KINDS = frozenset(
    {
        codes.ACL_MEMCPY_HOST_TO_DEVICE,
        codes.ACL_MEMCPY_DEVICE_TO_HOST,
        codes.ACL_MEMCPY_DEVICE_TO_DEVICE,
        codes.ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE,
        codes.ACL_MEMCPY_INNER_DEVICE_TO_DEVICE,
        codes.ACL_MEMCPY_INTER_DEVICE_TO_DEVICE,
    }
)


# ---- devices and contexts --------------------------------------------------------------------
@api("i")
def set_device(rt, device_id, *, site):
    """aclrtSetDevice: bind the device to this thread; its default context becomes current."""
    rt.contexts.set_device(device_id, site=site)


@api("i")
def reset_device(rt, device_id, *, site):
    """aclrtResetDevice: drop one reference; the last waits for the device's work. Blocks."""
    rt.contexts.reset_device(device_id, site=site)


@api("i")
def reset_device_force(rt, device_id, *, site):
    """aclrtResetDeviceForce: release the device whatever its reference count. Blocks."""
    rt.contexts.reset_device_force(device_id, site=site)


@api("", (0,))
def get_device(rt):
    """aclrtGetDevice: `device_id, ret` of the current context."""
    return rt.contexts.get_device()


@api("", (0,))
def get_device_count(rt):
    """aclrtGetDeviceCount: `count, ret`."""
    return rt.contexts.get_device_count()


@api("", (codes.ACL_DEVICE,), needs_session=False)
def get_run_mode(rt):
    """aclrtGetRunMode: `ACL_HOST, ret` -- the program runs on the host, the device elsewhere."""
    return codes.ACL_HOST


@api("", delegate="sync.synchronize_device")
def synchronize_device(rt):
    """aclrtSynchronizeDevice: wait for all this process's work on the current device. Blocks."""


@api("i", delegate="sync.synchronize_device")
def synchronize_device_with_timeout(rt, timeout):
    """aclrtSynchronizeDeviceWithTimeout (ms; -1 forever): 507046 on timeout. Blocks."""


@api("i", (0,))
def create_context(rt, device_id, *, site):
    """aclrtCreateContext: `context, ret`; the new context becomes current for this thread."""
    return rt.contexts.create_context(device_id, site=site)


@api("k")
def destroy_context(rt, context, *, site):
    """aclrtDestroyContext: waits for its streams, then frees them. Blocks."""
    rt.contexts.destroy_context(context, site=site)


@api("k")
def set_context(rt, context):
    """aclrtSetCurrentContext (per thread)."""
    rt.contexts.set_context(context)


@api("", (0,))
def get_context(rt):
    """aclrtGetCurrentContext: `context, ret`."""
    return rt.contexts.get_context()


@api("", (0,))
def ctx_get_current_default_stream(rt):
    """aclrtCtxGetCurrentDefaultStream: `stream, ret` (the handle stream 0 stands for)."""
    return rt.contexts.default_stream()


# ---- streams -------------------------------------------------------------------------------------
@api("", (0,))
def create_stream(rt, *, site):
    """aclrtCreateStream: `stream, ret`, highest priority."""
    return rt.streams.create_stream(0, 0, site=site)


@api("ii", (0,))
def create_stream_with_config(rt, priority, flag, *, site):
    """aclrtCreateStreamWithConfig: `stream, ret`; priority 0 (highest) .. 7, clamped (as a
    uint32, so -1 is the lowest)."""
    return rt.streams.create_stream(
        min(priority & _U32, codes.STREAM_PRIORITY_LEAST), flag & _U32, site=site
    )


@api("k")
def destroy_stream(rt, stream, *, site):
    """aclrtDestroyStream: waits for the stream's tasks, then frees it. Blocks."""
    rt.streams.destroy_stream(stream, False, site=site)


@api("k")
def destroy_stream_force(rt, stream, *, site):
    """aclrtDestroyStreamForce: drops the stream's queued tasks, then frees it. Blocks."""
    rt.streams.destroy_stream(stream, True, site=site)


@api("k", delegate="sync.synchronize_stream")
def synchronize_stream(rt, stream):
    """aclrtSynchronizeStream: wait for the stream's tasks; returns their first failure. Blocks."""


@api("ki", delegate="sync.synchronize_stream")
def synchronize_stream_with_timeout(rt, stream, timeout):
    """aclrtSynchronizeStreamWithTimeout (ms; -1 forever, 0 just checks): 507046 on timeout."""


@api("k", (codes.ACL_STREAM_STATUS_RESERVED,))
def stream_query(rt, stream):
    """aclrtStreamQuery: `ACL_STREAM_STATUS_COMPLETE (0) or _NOT_READY (1), ret`."""
    return rt.sync.stream_query(stream)


@api("kk", delegate="events.stream_wait_event")
def stream_wait_event(rt, stream, event):
    """aclrtStreamWaitEvent (async): the stream's later tasks wait for the event's latest record."""


@api("kI")
def set_stream_failure_mode(rt, stream, mode, *, site):
    """aclrtSetStreamFailureMode: ACL_STOP_ON_FAILURE stops every stream of the context."""
    rt.streams.set_stream_failure_mode(stream, mode, site=site)


@api("", (0, 0), needs_session=False)
def device_get_stream_priority_range(rt):
    """aclrtDeviceGetStreamPriorityRange: `least (7), greatest (0), ret`."""
    return codes.STREAM_PRIORITY_LEAST, codes.STREAM_PRIORITY_GREATEST


# ---- events --------------------------------------------------------------------------------------
@api("", (0,))
def create_event(rt, *, site):
    """aclrtCreateEvent: `event, ret`."""
    return rt.events.create_event(0, site=site)


@api("I", (0,))
def create_event_with_flag(rt, flag, *, site):
    """aclrtCreateEventWithFlag: `event, ret` (ACL_EVENT_SYNC, ACL_EVENT_TIME_LINE, ...)."""
    return rt.events.create_event(flag, site=site)


@api("I", (0,))
def create_event_ex_with_flag(rt, flag, *, site):
    """aclrtCreateEventExWithFlag: `event, ret`; simnpu events are always reusable."""
    return rt.events.create_event(flag, site=site)


@api("k")
def destroy_event(rt, event, *, site):
    """aclrtDestroyEvent."""
    rt.events.destroy_event(event, site=site)


@api("kk", delegate="events.record_event")
def record_event(rt, event, stream):
    """aclrtRecordEvent (async)."""


@api("kk", delegate="events.reset_event")
def reset_event(rt, event, stream):
    """aclrtResetEvent (async)."""


@api("k", (codes.ACL_EVENT_RECORDED_STATUS_NOT_READY,))
def query_event_status(rt, event):
    """aclrtQueryEventStatus: `ACL_EVENT_RECORDED_STATUS_COMPLETE (1) or _NOT_READY (0), ret`."""
    return rt.sync.query_event_status(event)


@api("k", (codes.ACL_EVENT_STATUS_COMPLETE,))
def query_event(rt, event):
    """aclrtQueryEvent (deprecated): `ACL_EVENT_STATUS_COMPLETE (0) or _NOT_READY (1), ret`;
    207000 for an IPC event (query_event_status takes one)."""
    rt.events.not_for_ipc(event, "aclrtQueryEvent")
    recorded = rt.sync.query_event_status(event)
    return (
        codes.ACL_EVENT_STATUS_COMPLETE
        if recorded == codes.ACL_EVENT_RECORDED_STATUS_COMPLETE
        else codes.ACL_EVENT_STATUS_NOT_READY
    )


@api("k")
def synchronize_event(rt, event):
    """aclrtSynchronizeEvent: wait for the event's latest record. Blocks."""
    rt.sync.synchronize_event(event, -1)


@api("ki")
def synchronize_event_with_timeout(rt, event, timeout):
    """aclrtSynchronizeEventWithTimeout (ms; -1 forever): 507047 on timeout. Blocks."""
    rt.sync.synchronize_event(event, timeout)


@api("kk", (0.0,))
def event_elapsed_time(rt, start, end, *, site):
    """aclrtEventElapsedTime: `milliseconds (a C float), ret` between two completed records."""
    return _FLOAT.unpack(_FLOAT.pack(rt.events.event_elapsed_time(start, end, site=site)))[0]


# ---- memory --------------------------------------------------------------------------------------
@api("ki", (0,))
def malloc(rt, size, policy, *, site):
    """aclrtMalloc: `device_pointer, ret` on the current device (not dereferenceable here)."""
    return rt.memory.malloc(size, policy, site=site)


@api("ki", (0,))
def malloc_align32(rt, size, policy, *, site):
    """aclrtMallocAlign32: `device_pointer, ret`; allocated as malloc is (64-byte aligned)."""
    return rt.memory.malloc(size, policy, site=site)


@api("k")
def free(rt, dev_ptr, *, site):
    """aclrtFree: returns the block to the pool at once (does not wait for tasks)."""
    rt.memory.free(dev_ptr, site=site)


@api("k", (0,))
def malloc_host(rt, size, *, site):
    """aclrtMallocHost: `host_pointer, ret` to page-locked memory, a real address here."""
    return rt.host.malloc_host(size, site=site)


@api("k")
def free_host(rt, host_ptr, *, site):
    """aclrtFreeHost."""
    rt.host.free_host(host_ptr, site=site)


@api("i", (0, 0))
def get_mem_info(rt, attr, *, site):
    """aclrtGetMemInfo: `free, total, ret` of the current device's memory. Every attribute
    (DDR, HBM, their _HUGE/_NORMAL variants, ...) reports the one simulated memory."""
    return rt.memory.get_mem_info(attr, site=site)


@api("kkkki")
def memcpy(rt, dst, dest_max, src, count, kind, *, site):
    """aclrtMemcpy: synchronous copy. Blocks.

    Between two host pointers the copy is made whatever `kind` says (the CANN runtime
    decides host copies by address: the public memcpy samples pass DEVICE_TO_HOST for a
    pinned -> pageable copy). A kind that contradicts a device pointer is 107000."""
    if kind in _DEVICE_KINDS and dst < DEVICE_BASE and src < DEVICE_BASE:
        kind = codes.ACL_MEMCPY_HOST_TO_HOST
    rt.memory.memcpy(dst, dest_max, src, count, kind, site=site)


@api("kkkkik", delegate="memory.memcpy_async")
def memcpy_async(rt, dst, dest_max, src, count, kind, stream):
    """aclrtMemcpyAsync (async from pinned memory; from pageable memory it returns once the
    bytes have left it, as CUDA does)."""


@api("kkik")
def memset(rt, dev_ptr, max_count, value, count, *, site):
    """aclrtMemset: byte fill of device or host memory (decided by the address). Blocks."""
    rt.memory.memset(dev_ptr, max_count, value, count, site=site)


@api("kkikk", delegate="memory.memset_async")
def memset_async(rt, dev_ptr, max_count, value, count, stream):
    """aclrtMemsetAsync (async for device memory; host memory is filled at once)."""


# ---- kernels -------------------------------------------------------------------------------------
def _check_options(options, name: str) -> None:
    if options is None:
        return
    if not isinstance(options, list):
        raise ValueError(f"{name}: options must be a list of option dicts (or None)")  # noqa: TRY004 - as pyACL
    for option in options:
        if not isinstance(option, dict):
            raise TypeError(f"{name}: the bin_option argument is not dict")


@api("pO", (0,))
def binary_load_from_file(rt, path, options=None, *, site):
    """aclrtBinaryLoadFromFile: `binary, ret` -- the file is a simnpu kernel module (Python
    source with @kernel functions). Load options (lazy load, magic) change nothing here."""
    _check_options(options, "acl.rt.binary_load_from_file")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise _NpuError(
            codes.ACL_ERROR_RT_FILE_OPEN, f"cannot read kernel module {path}: {error}"
        ) from None
    return rt.kernels.binary_load(_source(data, path), os.fspath(path), site=site)


@api("OO", (0,))
def binary_load_from_data(rt, data, options=None, *, site):
    """aclrtBinaryLoadFromData: `binary, ret` from the kernel module's source (bytes or str)."""
    _check_options(options, "acl.rt.binary_load_from_data")
    if isinstance(data, str):
        return rt.kernels.binary_load(data, "<binary_load_from_data>", site=site)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"acl.rt.binary_load_from_data: data must be bytes or str, not {type(data).__name__}"
        )
    return rt.kernels.binary_load(
        _source(bytes(data), "<binary_load_from_data>"), "<binary_load_from_data>", site=site
    )


def _source(data: bytes, where) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _NpuError(
            codes.ACL_ERROR_INVALID_FILE,
            f"{where} is not a simnpu kernel module: kernels are Python source with @kernel "
            "functions (a compiled Ascend C binary cannot run on the simulated NPU)",
        ) from None


@api("k")
def binary_unload(rt, binary, *, site):
    """aclrtBinaryUnLoad: its functions become invalid handles."""
    rt.kernels.binary_unload(binary, site=site)


@api("ks", (0,))
def binary_get_function(rt, binary, kernel_name, *, site):
    """aclrtBinaryGetFunction: `function, ret`. acl.SIMNPU_BUILTIN_BINARY holds the built-in
    kernels (add_f32, matmul_f32, softmax_f32, ...)."""
    return rt.kernels.get_function(binary, kernel_name, site=site)


@api("kIkkk", delegate="kernels.launch_kernel_devargs", nonnull=("args_ptr",))
def launch_kernel(rt, func, num_blocks, args_ptr, args_size, stream):
    """aclrtLaunchKernel (async): the packed argument struct lies in device memory at args_ptr."""


@api("kIkOkkOk", delegate="kernels.launch_kernel_with_host_args", nonnull=("host_args_ptr",))
def launch_kernel_with_host_args(
    rt,
    func,
    num_blocks,
    stream,
    cfg,
    host_args_ptr,
    args_size,
    place_holders=None,
    place_holder_num=0,
):
    """aclrtLaunchKernelWithHostArgs (async): the packed argument struct lies in host memory
    at host_args_ptr (copied before the call returns). `cfg` may be None, 0 or []."""


@api("I")
def set_op_execute_time_out(rt, timeout, *, site):
    """aclrtSetOpExecuteTimeOut (seconds; 0 restores the daemon's default)."""
    rt.kernels.set_op_execute_timeout(timeout * 1000, site=site)


# ---- host callbacks and host functions -----------------------------------------------------------
@api("Kk")
def subscribe_report(rt, thread_id, stream):
    """aclrtSubscribeReport: thread `thread_id` runs the stream's callbacks in process_report."""
    rt.callbacks.subscribe_report(thread_id, stream)


@api("Kk")
def unsubscribe_report(rt, thread_id, stream):
    """aclrtUnSubscribeReport."""
    rt.callbacks.unsubscribe_report(thread_id, stream)


@api("COik")
def launch_callback(rt, fn, user_data, block_type, stream, *, site):
    """aclrtLaunchCallback (async): fn(user_data) runs on the subscribed thread when the
    stream reaches it; ACL_CALLBACK_BLOCK holds the stream until it returns."""
    if block_type not in (codes.ACL_CALLBACK_NO_BLOCK, codes.ACL_CALLBACK_BLOCK):
        raise _NpuError(
            codes.ACL_ERROR_INVALID_PARAM,
            f"block_type {block_type}: use ACL_CALLBACK_BLOCK or ACL_CALLBACK_NO_BLOCK",
        )
    rt.callbacks.launch_callback(fn, user_data, block_type, stream, site=site)


@api("i")
def process_report(rt, timeout):
    """aclrtProcessReport: run one callback of this thread's streams (ms > 0, or -1 forever);
    507012 when none arrives in time, 107012 while no stream is subscribed to this thread
    (at once). Blocks."""
    if timeout < -1 or timeout == 0:
        raise _NpuError(
            codes.ACL_ERROR_INVALID_PARAM,
            f"timeout {timeout}: -1 waits forever, a positive value waits that many milliseconds",
        )
    rt.callbacks.process_report(timeout)


@api("kCO")
def launch_host_func(rt, stream, fn, args, *, site):
    """aclrtLaunchHostFunc (async): fn(args) runs on a runtime thread in stream order; the
    stream waits for it."""
    rt.callbacks.launch_host_func(stream, fn, args, site=site)


# ---- errors --------------------------------------------------------------------------------------
def get_last_error(level=codes.ACL_RT_THREAD_LEVEL):
    """aclrtGetLastError: the last error code an acl call returned in this thread, cleared."""
    return (
        _last_error.code(clear=True)
        if level == codes.ACL_RT_THREAD_LEVEL
        else codes.ACL_ERROR_INVALID_PARAM
    )


def peek_at_last_error(level=codes.ACL_RT_THREAD_LEVEL):
    """aclrtPeekAtLastError: the same, not cleared."""
    return (
        _last_error.code(clear=False)
        if level == codes.ACL_RT_THREAD_LEVEL
        else codes.ACL_ERROR_INVALID_PARAM
    )


# ---- what simnpu does not simulate ---------------------------------------------------------------
UNSUPPORTED = sorted([*_more.CALLS, *_more.VALUES])
for _name, (_call, _outputs, _why) in _more.CALLS.items():
    globals()[_name] = not_supported(f"acl.rt.{_name}", _call, _why, _outputs)
for _name, (_call, _value, _why) in _more.VALUES.items():
    globals()[_name] = not_supported(f"acl.rt.{_name}", _call, _why, (_value,), returns_code=False)
del _name, _call, _outputs, _why, _value, _more, api, not_supported

# Device memory, IPC sharing and stream-ordered pools are acl.rt calls too, written in
# client/acl/rt_memory.py by the device-memory work (docs/memory.md); device queries,
# resource limits, memory helpers and host-function threads in client/acl/rt_devices.py.
__getattr__, __dir__ = _on_demand(
    globals(),
    _memory,
    _streams,
    _exceptions,
    _peers,
    _notify,
    _kernel_args,
    _devices,
    _cnt_notify,
    _values,
    _overflow,
    _builtin_tasks,
    _ipc_events,
    _flow,
    _vmm,
    _host_memory,
)
