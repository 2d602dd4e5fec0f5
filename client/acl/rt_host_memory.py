"""acl.rt host memory that kernels reach: registered pinned memory and managed memory
(aclrtHostRegister(V2), aclrtHostGetDevicePointer, aclrtHostUnregister,
aclrtMemAllocManaged, and managed memory's advice, prefetches and range attributes).

Written like the rest of acl.rt (client/acl/rt.py, which offers the calls this module lists
in `__all__` as its own): pyACL's argument checks and return shapes, the ACL code last.
Semantics in docs/acl.md, the design in docs/device-memory.md.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = [
    "host_get_device_pointer",
    "host_register",
    "host_register_v2",
    "host_unregister",
    "mem_alloc_managed",
    "mem_managed_advise",
    "mem_managed_get_attr",
    "mem_managed_get_attrs",
    "mem_managed_prefetch_async",
    "mem_managed_prefetch_batch_async",
]


@api("kKi", (0,))
def host_register(rt, ptr, size, type, *, site):
    """aclrtHostRegister: `dev_ptr, ret`, the device pointer of `size` bytes of pinned memory
    at `ptr` (private memory: 207000). type: ACL_HOST_REGISTER_MAPPED (0) or an OR of
    ACL_HOST_REGISTER_IOMEMORY and _READONLY. Blocks."""
    return rt.host.host_register(ptr, size, type, site=site)


@api("kKI")
def host_register_v2(rt, ptr, size, flag, *, site):
    """aclrtHostRegisterV2: register `size` bytes of pinned memory at `ptr`; flag: an OR of
    ACL_HOST_REG_MAPPED, _IOMEMORY, _READONLY, _PINNED. Blocks."""
    rt.host.host_register_v2(ptr, size, flag, site=site)


@api("kI", (0,))
def host_get_device_pointer(rt, host_ptr, flag):
    """aclrtHostGetDevicePointer: `dev_ptr, ret` of registered host memory (flag 0)."""
    return rt.host.host_get_device_pointer(host_ptr, flag)


@api("k")
def host_unregister(rt, ptr, *, site):
    """aclrtHostUnregister of the start of a registered range. Blocks."""
    rt.host.host_unregister(ptr, site=site)


@api("KI", (0,))
def mem_alloc_managed(rt, size, flag, *, site):
    """aclrtMemAllocManaged: `ptr, ret`, memory usable at `ptr` here and by kernels; flag
    ACL_RT_MEM_ATTACH_GLOBAL; free it with free. Blocks."""
    return rt.managed.mem_alloc_managed(size, flag, site=site)


@api("KKIO")
def mem_managed_advise(rt, ptr, size, advise, location):
    """aclrtMemManagedAdvise: record `advise` (ACL_MEM_ADVISE_*) for `size` bytes of managed
    memory at `ptr`; location a dict {"type": ACL_MEM_LOCATIONTYPE_*, "id": ...}."""
    rt.managed.mem_managed_advise(ptr, size, advise, location)


@api("KKOIk", delegate="managed.mem_managed_prefetch_async")
def mem_managed_prefetch_async(rt, ptr, size, location, flags, stream):
    """aclrtMemManagedPrefetchAsync (async): a task of `stream` after which `location` is the
    range's last prefetch location (no bytes move); flags 0."""


@api("OOKOOKKk", delegate="managed.mem_managed_prefetch_batch_async")
def mem_managed_prefetch_batch_async(
    rt, ptrs, sizes, count, prefetch_locs, prefetch_loc_idxs, num_prefetch_locs, flags, stream
):
    """aclrtMemManagedPrefetchBatchAsync (async): lists as the C arrays; prefetch_locs[k]
    (a location dict) applies from ptrs[prefetch_loc_idxs[k]] to the next index."""


@api("IKKK", (0,))
def mem_managed_get_attr(rt, attribute, ptr, size, data_size):
    """aclrtMemManagedGetAttr: `value, ret`, an int (a list of data_size // 4 ids for
    ACL_MEM_RANGE_ATTRIBUTE_ACCESSED_BY) of `size` bytes of managed memory at `ptr`."""
    return rt.managed.mem_managed_get_attr(attribute, ptr, size, data_size)


@api("OKKO", ([],))
def mem_managed_get_attrs(rt, attributes, ptr, size, data_sizes):
    """aclrtMemManagedGetAttrs: `values, ret`, one value per attribute as get_attr."""
    return rt.managed.mem_managed_get_attrs(attributes, ptr, size, data_sizes)


__getattr__, __dir__ = _on_demand(globals())
