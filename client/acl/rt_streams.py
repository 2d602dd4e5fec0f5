"""acl.rt stream and event calls beyond the basics: stream config handles and
aclrtCreateStreamV2, stream introspection, stream state callbacks, aborting and stopping a
stream, stream resource limits, events recorded and waited with a flag or timeout, event
timestamps.

Written like the rest of acl.rt (client/acl/rt.py, which offers the calls this module lists
in `__all__` as its own): pyACL's argument checks and return shapes, the ACL code last.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand
from simnpu.client.runtime.streams import STREAM_CONFIGS as _CONFIGS
from simnpu.client.stream_states import STREAM_STATES as _STATES
from simnpu.proto import codes
from simnpu.proto.errors import NpuError as _NpuError

__all__ = [
    "create_stream_config_handle",
    "create_stream_v2",
    "destroy_stream_config_handle",
    "event_get_timestamp",
    "get_stream_res_limit",
    "record_event_with_flag",
    "reg_stream_state_callback",
    "reset_stream_res_limit",
    "set_stream_config_opt",
    "set_stream_res_limit",
    "stream_abort",
    "stream_get_flags",
    "stream_get_id",
    "stream_get_priority",
    "stream_stop",
    "stream_wait_event_with_flag",
    "stream_wait_event_with_timeout",
    "unuse_stream_res_in_current_thread",
    "use_stream_res_in_current_thread",
]


# ---- stream config handles and aclrtCreateStreamV2 --------------------------------------------
def create_stream_config_handle():
    """aclrtCreateStreamConfigHandle: a config handle (an int; its fields are 0). Host only."""
    return _CONFIGS.create()


@api("kIO", needs_session=False)
def set_stream_config_opt(rt, handle, attr, value):
    """aclrtSetStreamConfigOpt: set ACL_RT_STREAM_FLAG, _PRIORITY, _WORK_ADDR_PTR or
    _WORK_SIZE of a config handle to the int `value` (the C call's attrValue and its size).
    100000 for a null or unknown handle, another attribute or a value that is not an int."""
    _CONFIGS.set(handle, attr, value)


@api("k", needs_session=False)
def destroy_stream_config_handle(rt, handle):
    """aclrtDestroyStreamConfigHandle: 100000 for a null or unknown handle. Host only."""
    _CONFIGS.destroy(handle)


@api("k", (0,))
def create_stream_v2(rt, handle, *, site):
    """aclrtCreateStreamV2: `stream, ret` with the config handle's priority (clamped to
    0..7) and flags; the work memory fields change nothing. 100000 for a null handle."""
    return rt.streams.create_stream_v2(handle, site=site)


# ---- stream introspection and state callbacks ------------------------------------------------
@api("k", (0,))
def stream_get_id(rt, stream):
    """aclrtStreamGetId: `stream_id, ret`, the number the timeline and exception infos use."""
    return rt.streams.stream_get_id(stream)


@api("k", (0,))
def stream_get_priority(rt, stream):
    """aclrtStreamGetPriority: `priority, ret` (0 highest .. 7)."""
    return rt.streams.stream_get_priority(stream)


@api("k", (0,))
def stream_get_flags(rt, stream):
    """aclrtStreamGetFlags: `flags, ret` (the ACL_STREAM_* flags it was created with)."""
    return rt.streams.stream_get_flags(stream)


@api("OOO", needs_session=False)
def reg_stream_state_callback(rt, reg_name, callback, args):
    """aclrtRegStreamStateCallback: `callback(stream, state, args)` runs on the creating
    thread after a stream is created (ACL_RT_STREAM_STATE_CREATE_POST) and before one is
    destroyed (_DESTROY_PRE); None removes the callback of that name. 100000 for a null
    name."""
    if reg_name is None:
        raise _NpuError(codes.ACL_ERROR_INVALID_PARAM, "reg_name is null")
    if not isinstance(reg_name, str):
        raise TypeError("acl.rt.reg_stream_state_callback: reg_name must be a str")
    if callback is not None and not callable(callback):
        raise TypeError("acl.rt.reg_stream_state_callback: callback must be callable or None")
    _STATES.register(reg_name, callback, args)


# ---- ending a stream's work --------------------------------------------------------------------
@api("k")
def stream_abort(rt, stream, *, site):
    """aclrtStreamAbort: the stream's running kernel or copy is ended and its queued tasks
    are discarded (their event records still fire); its next synchronize returns 107023
    once, then it works as before. 0: the default stream. Blocks until done."""
    rt.streams.stream_abort(stream, site=site)


@api("k")
def stream_stop(rt, stream, *, site):
    """aclrtStreamStop: the stream's running kernel or copy is ended; its queued tasks run
    next, and its next synchronize returns 107023 once. 107000 for the default stream
    (0). Blocks until done."""
    rt.streams.stream_stop(stream, site=site)


# ---- stream resource limits --------------------------------------------------------------------
@api("kI", (0,))
def get_stream_res_limit(rt, stream, type, *, site):  # noqa: A002 - pyACL's parameter name
    """aclrtGetStreamResLimit: `value, ret`, the stream's own limit of the type, else its
    process's on the device (set_device_res_limit), else every AI core. 0: the
    default stream. 107000 for another type. Blocks."""
    return rt.streams.get_stream_res_limit(stream, type, site=site)


@api("kII")
def set_stream_res_limit(rt, stream, type, value, *, site):  # noqa: A002 - pyACL's parameter name
    """aclrtSetStreamResLimit: the stream's kernels run on at most `value` AI cores (the
    smaller of its cube and vector limits in force; the stream's limit wins over its
    process's, even when larger). 107000 for another type or a value outside 1 .. the
    device's AI cores. Blocks."""
    rt.streams.set_stream_res_limit(stream, type, value, site=site)


@api("k")
def reset_stream_res_limit(rt, stream, *, site):
    """aclrtResetStreamResLimit: the stream follows its process's limits again. Blocks."""
    rt.streams.reset_stream_res_limit(stream, site=site)


@api("k")
def use_stream_res_in_current_thread(rt, stream):
    """aclrtUseStreamResInCurrentThread: get_res_in_current_thread on this thread reads the
    stream's limits (the last stream given wins). Host only."""
    rt.streams.use_stream_res_in_current_thread(stream)


@api("k")
def unuse_stream_res_in_current_thread(rt, stream):
    """aclrtUnuseStreamResInCurrentThread: this thread reads its process's limits again."""
    rt.streams.unuse_stream_res_in_current_thread(stream)


# ---- events ----------------------------------------------------------------------------------
@api("kkI")
def record_event_with_flag(rt, event, stream, flag, *, site):
    """aclrtRecordEventWithFlag (async): ACL_EVENT_RECORD_DEFAULT records as record_event;
    ACL_EVENT_RECORD_EXTERNAL needs a stream being captured (107029). 100000 for a null
    event or another flag."""
    rt.events.record_event_with_flag(event, stream, flag, site=site)


@api("kkII")
def stream_wait_event_with_flag(rt, stream, event, timeout, flag, *, site):
    """aclrtStreamWaitEventWithFlag (async): ACL_EVENT_WAIT_DEFAULT waits as
    stream_wait_event_with_timeout; ACL_EVENT_WAIT_EXTERNAL (timeout 0 only, else 100000)
    needs a stream being captured (107029). 100000 for a null event or another flag."""
    rt.events.stream_wait_event_with_flag(stream, event, timeout, flag, site=site)


@api("kki")
def stream_wait_event_with_timeout(rt, stream, event, timeout, *, site):
    """aclrtStreamWaitEventWithTimeout (async; timeout in seconds): 0 waits as
    stream_wait_event; below 0 is 107000; a wait whose event has not completed within the
    timeout fails: the stream's next synchronize returns 107019 and the stream goes on."""
    rt.events.stream_wait_event_with_timeout(stream, event, timeout, site=site)


@api("k", (0,))
def event_get_timestamp(rt, event, *, site):
    """aclrtEventGetTimestamp: `microseconds, ret` -- when the event's latest record ran,
    on the device clock (time since the host system started). Blocks. 100000 for a null
    event, 507000 if it was never recorded, 107006 if that record has not run yet."""
    return rt.events.event_get_timestamp(event, site=site)


__getattr__, __dir__ = _on_demand(globals())
