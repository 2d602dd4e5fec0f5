"""acl.rt notify calls: a flag one stream sets and another waits for, in one process or
shared between processes by key (client/runtime/notifies.py, server/core/notifies.py).

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = [
    "create_notify",
    "destroy_notify",
    "notify_get_export_key",
    "notify_import_by_key",
    "notify_set_import_pid",
    "record_notify",
    "wait_and_reset_notify",
]


@api("K", (0,))
def create_notify(rt, flag, *, site):
    """aclrtCreateNotify: `notify, ret` on the current device (flag ACL_NOTIFY_DEFAULT or
    ACL_NOTIFY_DEVICE_USE_ONLY); 207009 past the device's 8192 notifies. Blocks."""
    return rt.notifies.create_notify(flag, site=site)


@api("k")
def destroy_notify(rt, notify, *, site):
    """aclrtDestroyNotify: a shared notify goes when every process holding it destroyed it."""
    rt.notifies.destroy_notify(notify, site=site)


@api("kk", delegate="notifies.record_notify")
def record_notify(rt, notify, stream):
    """aclrtRecordNotify (async): sets the notify when the stream gets there."""


@api("kkI", delegate="notifies.wait_and_reset_notify")
def wait_and_reset_notify(rt, notify, stream, timeout):
    """aclrtWaitAndResetNotify (async): the stream waits until the notify is set, then clears
    it; timeout in seconds (0 waits forever), past it the stream's next synchronize reports
    ACL_ERROR_RT_WAIT_TIMEOUT (107019)."""


@api("kK", ("",))
def notify_get_export_key(rt, notify, flags, *, site):
    """aclrtNotifyGetExportKey: `key, ret` for another process's notify_import_by_key.
    flags: ACL_RT_NOTIFY_EXPORT_FLAG_DEFAULT (0, only pids set with notify_set_import_pid
    may import) or _DISABLE_PID_VALIDATION (2). Blocks."""
    return rt.notifies.notify_get_export_key(notify, flags, site=site)


@api("kO")
def notify_set_import_pid(rt, notify, pids, *, site):
    """aclrtNotifySetImportPid: whitelist the processes (a list of device_get_bare_tgid
    values) that may import the exported notify. Blocks."""
    try:
        pids = [int(pid) for pid in pids]
    except (TypeError, ValueError):
        raise TypeError("acl.rt.notify_set_import_pid: pids must be a list of ints") from None
    rt.notifies.notify_set_import_pid(notify, pids, site=site)


@api("sK", (0,))
def notify_import_by_key(rt, key, flags, *, site):
    """aclrtNotifyImportByKey: `notify, ret` in this process (flags
    ACL_RT_NOTIFY_IMPORT_FLAG_DEFAULT or _ENABLE_PEER_ACCESS). Blocks."""
    return rt.notifies.notify_import_by_key(key, flags, site=site)


__getattr__, __dir__ = _on_demand(globals())
