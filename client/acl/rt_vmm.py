"""acl.rt virtual-memory calls: reserved address ranges, physical memory, mappings, access,
pointer attributes, and physical memory shared between processes.

Written like the rest of acl.rt (client/acl/rt.py, which offers the calls this module lists
in `__all__` as its own): pyACL's argument checks and return shapes, the ACL code last.
ACL structs are dicts with the C field names in snake case: aclrtPhysicalMemProp is
{"handle_type", "allocation_type", "mem_attr", "location": {"id", "type"}, "reserve"}.
Semantics in docs/acl.md, the design in docs/device-memory.md.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = [
    "free_physical",
    "malloc_physical",
    "map_mem",
    "mem_export_to_shareable_handle",
    "mem_export_to_shareable_handle_v2",
    "mem_get_access",
    "mem_get_address_range",
    "mem_get_allocation_granularity",
    "mem_get_allocation_properties_from_handle",
    "mem_import_from_shareable_handle",
    "mem_import_from_shareable_handle_v2",
    "mem_retain_allocation_handle",
    "mem_set_access",
    "mem_set_pid_to_shareable_handle",
    "mem_set_pid_to_shareable_handle_v2",
    "pointer_get_attributes",
    "release_mem_address",
    "reserve_mem_address",
    "reserve_mem_address_no_uc_memory",
    "unmap_mem",
]


@api("kkkK", (0,))
def reserve_mem_address(rt, size, alignment, expect_ptr, flags, *, site):
    """aclrtReserveMemAddress: `vir_ptr, ret`, the start of `size` bytes of device address
    space on the current device, nothing mapped. alignment: 0 or a power of two; expect_ptr:
    0 or the start wanted. Blocks."""
    return rt.vmm.reserve_mem_address(size, alignment, expect_ptr, flags, site=site)


@api("kkkK", (0,))
def reserve_mem_address_no_uc_memory(rt, size, alignment, expect_ptr, flags, *, site):
    """aclrtReserveMemAddressNoUCMemory: `vir_ptr, ret`; as reserve_mem_address, the start
    given (expect_ptr), whole GiB. Blocks."""
    return rt.vmm.reserve_mem_address_no_uc_memory(size, alignment, expect_ptr, flags, site=site)


@api("k")
def release_mem_address(rt, vir_ptr, *, site):
    """aclrtReleaseMemAddress of a range with nothing mapped in it. Blocks."""
    rt.vmm.release_mem_address(vir_ptr, site=site)


@api("kOK", (0,))
def malloc_physical(rt, size, prop, flags, *, site):
    """aclrtMallocPhysical: `handle, ret`, `size` bytes of device memory (prop's location
    type 1, its id the device). Blocks."""
    return rt.vmm.malloc_physical(size, prop, flags, site=site)


@api("k")
def free_physical(rt, handle, *, site):
    """aclrtFreePhysical: the memory goes once nothing maps it. Blocks."""
    rt.vmm.free_physical(handle, site=site)


@api("kkkkK")
def map_mem(rt, vir_ptr, size, offset, handle, flags, *, site):
    """aclrtMapMem: the whole physical allocation `handle` (size: its size, offset: 0) at
    `vir_ptr` of a reserved range. Blocks."""
    rt.vmm.map_mem(vir_ptr, size, offset, handle, flags, site=site)


@api("k")
def unmap_mem(rt, vir_ptr, *, site):
    """aclrtUnmapMem of the mapping that starts at `vir_ptr`. Blocks."""
    rt.vmm.unmap_mem(vir_ptr, site=site)


@api("kkOk")
def mem_set_access(rt, vir_ptr, size, desc, count):
    """aclrtMemSetAccess: desc is a list of `count` aclrtMemAccessDesc dicts {"flags",
    "location": {"id", "type"}}; only ACL_RT_MEM_ACCESS_FLAGS_READWRITE is simulated."""
    rt.vmm.mem_set_access(vir_ptr, size, desc, count)


@api("kO", (0,))
def mem_get_access(rt, vir_ptr, location):
    """aclrtMemGetAccess: `flag, ret` of mapped memory for the device `location`."""
    return rt.vmm.mem_get_access(vir_ptr, location)


@api("OI", (0,))
def mem_get_allocation_granularity(rt, prop, option):
    """aclrtMemGetAllocationGranularity: `granularity, ret` (2 MiB; 1 GiB for the 1G
    huge-page attributes)."""
    return rt.vmm.mem_get_allocation_granularity(prop, option)


@api("k", (0,))
def mem_retain_allocation_handle(rt, vir_ptr, *, site):
    """aclrtMemRetainAllocationHandle: `handle, ret` of the memory mapped at `vir_ptr`, one
    more reference (free_physical drops it). Blocks."""
    return rt.vmm.mem_retain_allocation_handle(vir_ptr, site=site)


@api("k", ({},))
def mem_get_allocation_properties_from_handle(rt, handle):
    """aclrtMemGetAllocationPropertiesFromHandle: `prop, ret` (an aclrtPhysicalMemProp dict)."""
    return rt.vmm.mem_get_allocation_properties_from_handle(handle)


@api("k", (0, 0))
def mem_get_address_range(rt, ptr):
    """aclrtMemGetAddressRange: `base, size, ret` of the allocation, mapping or pinned host
    block holding `ptr`."""
    return rt.vmm.mem_get_address_range(ptr)


@api("k", ({},))
def pointer_get_attributes(rt, ptr):
    """aclrtPointerGetAttributes: `attributes, ret`, {"location": {"id", "type"},
    "page_size"}."""
    return rt.vmm.pointer_get_attributes(ptr)


# ---- physical memory shared between processes ------------------------------------------------
def _pids(pids, name: str) -> list[int]:
    try:
        return [int(pid) for pid in pids]
    except (TypeError, ValueError):
        raise TypeError(f"acl.rt.{name}: pids must be a list of ints") from None


@api("kIK", (0,))
def mem_export_to_shareable_handle(rt, handle, handle_type, flags, *, site):
    """aclrtMemExportToShareableHandle: `shareable_handle, ret` for other processes of the
    daemon. flags: ACL_RT_VMM_EXPORT_FLAG_DEFAULT (0, only pids set with
    mem_set_pid_to_shareable_handle import) or _DISABLE_PID_VALIDATION (1). Blocks."""
    return rt.vmm.mem_export_to_shareable_handle(handle, handle_type, flags, site=site)


@api("kKI", (0,))
def mem_export_to_shareable_handle_v2(rt, handle, flags, share_type, *, site):
    """aclrtMemExportToShareableHandleV2: `shareable_handle, ret` (share type DEFAULT: a
    64-bit number; FABRIC, between servers, is 207000). Blocks."""
    return rt.vmm.mem_export_to_shareable_handle_v2(handle, flags, share_type, site=site)


@api("KO")
def mem_set_pid_to_shareable_handle(rt, shareable_handle, pids, *, site):
    """aclrtMemSetPidToShareableHandle: whitelist processes (a list of device_get_bare_tgid
    values). Blocks."""
    rt.vmm.mem_set_pid_to_shareable_handle(
        shareable_handle, _pids(pids, "mem_set_pid_to_shareable_handle"), site=site
    )


@api("KIO")
def mem_set_pid_to_shareable_handle_v2(rt, shareable_handle, share_type, pids, *, site):
    """aclrtMemSetPidToShareableHandleV2. Blocks."""
    rt.vmm.mem_set_pid_to_shareable_handle_v2(
        shareable_handle, share_type, _pids(pids, "mem_set_pid_to_shareable_handle_v2"), site=site
    )


@api("Ki", (0,))
def mem_import_from_shareable_handle(rt, shareable_handle, device_id, *, site):
    """aclrtMemImportFromShareableHandle: `handle, ret`, this process's handle of the
    exported physical memory (for its own device). Blocks."""
    return rt.vmm.mem_import_from_shareable_handle(shareable_handle, device_id, site=site)


@api("KIK", (0,))
def mem_import_from_shareable_handle_v2(rt, shareable_handle, share_type, flags, *, site):
    """aclrtMemImportFromShareableHandleV2: `handle, ret` for the current device. Blocks."""
    return rt.vmm.mem_import_from_shareable_handle_v2(
        shareable_handle, share_type, flags, site=site
    )


__getattr__, __dir__ = _on_demand(globals())
