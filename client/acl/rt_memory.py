"""acl.rt device-memory calls beyond malloc/free: IPC sharing and stream-ordered pools.

Written like the rest of acl.rt (client/acl/rt.py, which offers the calls this module lists
in `__all__` as its own): pyACL's argument checks and return shapes, the ACL code last.
Semantics in docs/memory.md.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand
from simnpu.proto.errors import invalid

__all__ = [
    "device_get_bare_tgid",
    "ipc_mem_close",
    "ipc_mem_get_export_key",
    "ipc_mem_import_by_key",
    "ipc_mem_set_import_pid",
    "mem_pool_create",
    "mem_pool_destroy",
    "mem_pool_free_async",
    "mem_pool_get_attr",
    "mem_pool_malloc_async",
    "mem_pool_set_attr",
    "mem_pool_trim_to",
]


# ---- IPC memory ------------------------------------------------------------------------------
@api("", (0,))
def device_get_bare_tgid(rt):
    """aclrtDeviceGetBareTgid: `pid, ret`, the id an exporter whitelists for this process."""
    return rt.memory.device_get_bare_tgid()


@api("kkK", ("",), nonnull=("dev_ptr",))
def ipc_mem_get_export_key(rt, dev_ptr, size, flags, *, site):
    """aclrtIpcMemGetExportKey: `key, ret` sharing [dev_ptr, dev_ptr + size) of one of this
    process's allocations. flags: ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT (0, only pids set with
    ipc_mem_set_import_pid may import) or _DISABLE_PID_VALIDATION (1). Blocks."""
    return rt.memory.ipc_mem_get_export_key(dev_ptr, size, flags, site=site)


@api("sO")
def ipc_mem_set_import_pid(rt, key, pids, *, site):
    """aclrtIpcMemSetImportPid: whitelist the processes (a list of device_get_bare_tgid
    values) that may import `key`. Blocks."""
    try:
        pids = [int(pid) for pid in pids]
    except (TypeError, ValueError):
        raise TypeError("acl.rt.ipc_mem_set_import_pid: pids must be a list of ints") from None
    rt.memory.ipc_mem_set_import_pid(key, pids, site=site)


@api("sK", (0,))
def ipc_mem_import_by_key(rt, key, flags, *, site):
    """aclrtIpcMemImportByKey: `dev_ptr, ret` of the memory exported under `key`, usable
    here until ipc_mem_close(key). Blocks."""
    return rt.memory.ipc_mem_import_by_key(key, flags, site=site)


@api("s")
def ipc_mem_close(rt, key, *, site):
    """aclrtIpcMemClose: importers close first, then the exporter (then acl.rt.free). Blocks."""
    rt.memory.ipc_mem_close(key, site=site)


# ---- stream-ordered pools -----------------------------------------------------------------------
def _props(props) -> tuple[int, int | None]:
    """(maxSize, device) from aclrtMemPoolProps given as a dict (None: defaults)."""
    if props is None:
        return 0, None
    if not isinstance(props, dict):
        raise TypeError("acl.rt.mem_pool_create: props must be a dict (aclrtMemPoolProps) or None")
    max_size = props.get("max_size", props.get("maxSize", 0))
    location = props.get("location") or {}
    device = location.get("id") if isinstance(location, dict) else None
    if not isinstance(max_size, int) or (device is not None and not isinstance(device, int)):
        raise invalid("aclrtMemPoolProps: max_size and location.id must be ints")
    return max_size, device


@api("O", (0,))
def mem_pool_create(rt, props, *, site):
    """aclrtMemPoolCreate: `pool, ret`. props: {"max_size": bytes (0 = no cap),
    "location": {"id": device}} (other aclrtMemPoolProps fields are accepted and ignored).
    Blocks."""
    max_size, device = _props(props)
    return rt.memory.mem_pool_create(max_size, device, site=site)


@api("k")
def mem_pool_destroy(rt, pool, *, site):
    """aclrtMemPoolDestroy: blocks still allocated from the pool are freed. Blocks."""
    rt.memory.mem_pool_destroy(pool, site=site)


@api("kkk", (0,))
def mem_pool_malloc_async(rt, size, pool, stream, *, site):
    """aclrtMemPoolMallocAsync: `dev_ptr, ret`, usable by work queued after this call."""
    return rt.memory.mem_pool_malloc_async(size, pool, stream, site=site)


@api("kk", nonnull=("dev_ptr",))
def mem_pool_free_async(rt, dev_ptr, stream, *, site):
    """aclrtMemPoolFreeAsync (async): the block returns when `stream` reaches the free."""
    rt.memory.mem_pool_free_async(dev_ptr, stream, site=site)


@api("kIK")
def mem_pool_set_attr(rt, pool, attr, value, *, site):
    """aclrtMemPoolSetAttr (ACL_RT_MEM_POOL_* attributes; high-water marks reset to 0). Blocks."""
    rt.memory.mem_pool_set_attr(pool, attr, value, site=site)


@api("kI", (0,))
def mem_pool_get_attr(rt, pool, attr, *, site):
    """aclrtMemPoolGetAttr: `value, ret`. Blocks."""
    return rt.memory.mem_pool_get_attr(pool, attr, site=site)


@api("kK")
def mem_pool_trim_to(rt, pool, min_bytes_to_keep, *, site):
    """aclrtMemPoolTrimTo: reserved and not supported in ACL itself: 207000."""
    rt.memory.mem_pool_trim_to(pool, min_bytes_to_keep, site=site)


__getattr__, __dir__ = _on_demand(globals())
