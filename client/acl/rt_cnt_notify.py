"""acl.rt count notify calls: a 32-bit count streams set, add to or mask and wait on with a
condition (client/runtime/notifies.py, server/core/cnt_notifies.py).

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last. The
info structs are dicts with the C fields in snake case.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

__all__ = [
    "cnt_notify_create",
    "cnt_notify_destroy",
    "cnt_notify_get_id",
    "cnt_notify_record",
    "cnt_notify_reset",
    "cnt_notify_wait_with_timeout",
]


def _fields(info, name: str, fields: tuple[str, ...]) -> list[int]:
    """The int fields of an info dict; None is C's null pointer (ACL_ERROR_INVALID_PARAM)."""
    if info is None:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "info is null")
    if not isinstance(info, dict):
        raise TypeError(f"acl.rt.{name}: info must be a dict with keys {', '.join(fields)}")
    values = []
    for field in fields:
        value = info.get(field)
        if value.__class__ is not int:
            raise TypeError(f"acl.rt.{name}: info[{field!r}] must be an int, not {value!r}")
        values.append(value)
    return values


@api("K", (0,))
def cnt_notify_create(rt, flag, *, site):
    """aclrtCntNotifyCreate: `cnt_notify, ret` on the current device (flag reserved: 0);
    207009 past the device's 8192 count notifies. Blocks."""
    return rt.notifies.cnt_notify_create(flag, site=site)


@api("k")
def cnt_notify_destroy(rt, cnt_notify, *, site):
    """aclrtCntNotifyDestroy. Blocks."""
    rt.notifies.cnt_notify_destroy(cnt_notify, site=site)


@api("k", (0,))
def cnt_notify_get_id(rt, cnt_notify):
    """aclrtCntNotifyGetId: `notify_id, ret`, unique among the device's live count notifies."""
    return rt.notifies.cnt_notify_get_id(cnt_notify)


@api("kkO")
def cnt_notify_record(rt, cnt_notify, stream, info, *, site):
    """aclrtCntNotifyRecord (async): info {"mode": ACL_RT_CNT_NOTIFY_RECORD_*, "value": uint32}
    sets (0), adds to (1, wrapping), ORs (2) or ANDs (4) the count when the stream gets
    there."""
    mode, value = _fields(info, "cnt_notify_record", ("mode", "value"))
    rt.notifies.cnt_notify_record(cnt_notify, stream, mode, value, site=site)


@api("kk", delegate="notifies.cnt_notify_reset")
def cnt_notify_reset(rt, cnt_notify, stream):
    """aclrtCntNotifyReset (async): the count goes to 0 when the stream gets there."""


@api("kkO")
def cnt_notify_wait_with_timeout(rt, cnt_notify, stream, info, *, site):
    """aclrtCntNotifyWaitWithTimeout (async): the stream waits until the count satisfies
    info {"mode": ACL_RT_CNT_NOTIFY_WAIT_* (LESS 0, EQUAL 1, BIGGER 2, BIGGER_OR_EQUAL 3,
    EQUAL_WITH_BITMASK 4), "value": uint32, "timeout": seconds (0 waits forever),
    "is_clear": 1 to set the count to 0 once satisfied}; past the timeout the stream's next
    synchronize reports ACL_ERROR_RT_WAIT_TIMEOUT (107019)."""
    mode, value, timeout, clear = _fields(
        info, "cnt_notify_wait_with_timeout", ("mode", "value", "timeout", "is_clear")
    )
    rt.notifies.cnt_notify_wait_with_timeout(
        cnt_notify, stream, mode, value, timeout, bool(clear), site=site
    )


__getattr__, __dir__ = _on_demand(globals())
