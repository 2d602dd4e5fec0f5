"""rt.vmm: virtual memory -- reserved address ranges, physical allocations, mappings,
access, what a pointer is (aclrtReserveMemAddress, aclrtMallocPhysical, aclrtMapMem,
aclrtPointerGetAttributes...), and sharing physical memory between processes of one daemon
(aclrtMemExportToShareableHandle, aclrtMemSetPidToShareableHandle,
aclrtMemImportFromShareableHandle and their V2 forms).

Reserved ranges and mappings are in the allocation index (client/runtime/allocation_index.py),
so that copies, memsets, launches and collectives on mapped memory are checked without a
round trip, like aclrtMalloc memory; the physical handles are kept here, an imported one
like one this process allocated. The daemon's side is server/memory/virtual_memory.py and
server/memory/shareable_memory.py; the design is in docs/device-memory.md.
"""

from __future__ import annotations

import mmap
import threading
from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime.arguments import acl_param, check_allocatable, wire_int
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.shm.addresses import is_device_address, split_device_address

if TYPE_CHECKING:
    from simnpu.client.runtime.shared import Shared

GRANULARITY = 2 << 20  # every attribute's but the 1 GiB huge pages'
# (server/memory/virtual_memory.py)
GRANULARITY_1G = 1 << 30
_HUGE_1G = (codes.ACL_HBM_MEM_HUGE1G, codes.ACL_MEM_HUGE1G, codes.ACL_MEM_P2P_HUGE1G)
_HOST_ONLY = (
    codes.ACL_DDR_MEM_HUGE,
    codes.ACL_DDR_MEM_NORMAL,
    codes.ACL_DDR_MEM_P2P_HUGE,
    codes.ACL_DDR_MEM_P2P_NORMAL,
)
_MEM_ATTRS = frozenset(range(codes.ACL_DDR_MEM_HUGE, codes.ACL_MEM_P2P_HUGE1G + 1)) - {
    codes.ACL_HBM_MEM_P2P_HUGE,
    codes.ACL_HBM_MEM_P2P_NORMAL,
    codes.ACL_HBM_MEM_P2P_HUGE1G,
}  # the attributes ACL's memAttrHandlers know
_HOST_LOCATIONS = (codes.ACL_MEM_LOCATION_TYPE_HOST, codes.ACL_MEM_LOCATION_TYPE_HOST_NUMA)
_ACCESS_FLAGS = (
    codes.ACL_RT_MEM_ACCESS_FLAGS_NONE,
    codes.ACL_RT_MEM_ACCESS_FLAGS_READ,
    codes.ACL_RT_MEM_ACCESS_FLAGS_READWRITE,
)


def _field(value: Any, *path: str) -> int:
    """An int field of an ACL struct given as a dict (absent: 0, as in a zeroed struct)."""
    for key in path:
        if isinstance(value, dict):
            value = value.get(key, 0)
        elif value != 0:
            raise acl_param(f"{key} must be in a dict (an ACL struct), not {value!r}")
    if not isinstance(value, int):
        raise acl_param(f"{'.'.join(path)} must be an int, not {value!r}")
    return value


def _not_mapped(address: int) -> NpuError:
    return invalid(f"{address:#x} is not inside memory this process mapped")


def _share_type(share_type: int) -> None:
    """The V2 calls' aclrtMemSharedHandleType: DEFAULT (a 64-bit number) only."""
    if share_type == codes.ACL_MEM_SHARE_HANDLE_TYPE_FABRIC:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "fabric handles (sharing between servers) are not simulated: the daemon serves "
            "one host (use ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT)",
        )
    if share_type != codes.ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT:
        raise invalid(f"share type {share_type} does not exist")


class VirtualMemory:
    """Virtual memory calls (see the module docstring)."""

    def __init__(self, shared: Shared):
        self._calls, self._contexts = shared.calls, shared.contexts
        self._allocations, self._host = shared.allocations, shared.host
        self._lock = threading.Lock()
        self._physical: dict[int, list[int]] = {}  # handle -> [size, device, attr, references]

    # ---- reserved ranges -----------------------------------------------------------------------
    @records_errors
    def reserve_mem_address(
        self,
        size: int,
        alignment: int = 0,
        expect_ptr: int = 0,
        flags: int = 0,
        site: str | None = None,
    ) -> int:
        """aclrtReserveMemAddress: the start of `size` bytes of device address space on the
        current device (rounded up to 2 MiB), nothing behind it. Blocks."""
        if size <= 0:
            raise acl_param(f"cannot reserve {size} bytes")
        if flags not in (0, 1):
            raise acl_param(f"flags {flags}: only 0 (or 1, kept for compatibility) is allowed")
        check_allocatable(size, "device address space")
        wire_int(alignment, "alignment")
        device = self._contexts.current().device
        request = pb.ReserveMemAddressRequest(
            device=device, size=size, alignment=alignment, expect=expect_ptr
        )
        reply = self._calls.request(request, site)
        self._allocations.reserve(reply.address, reply.size, device)
        return reply.address

    @records_errors
    def reserve_mem_address_no_uc_memory(
        self, size: int, alignment: int, expect_ptr: int, flags: int, site: str | None = None
    ) -> int:
        """aclrtReserveMemAddressNoUCMemory: the same as reserve_mem_address here (simnpu has
        no operators that bypass the L2 cache), with ACL's rules: the start must be given
        (207000 without) and the size be whole GiB. Blocks."""
        if not expect_ptr:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "aclrtReserveMemAddressNoUCMemory needs expect_ptr: the start is not chosen",
            )
        if size <= 0 or size % GRANULARITY_1G:
            raise invalid(f"size {size} is not a positive multiple of 1 GiB")
        return self.reserve_mem_address(size, alignment, expect_ptr, flags, site)

    @records_errors
    def release_mem_address(self, address: int, site: str | None = None) -> None:
        """aclrtReleaseMemAddress of a range with nothing mapped in it. Blocks."""
        if not address:
            raise acl_param("null pointer passed to release_mem_address")
        if not self._allocations.is_reserved(address):
            raise invalid(f"{address:#x} is not the start of a range this process reserved")
        self._calls.request(pb.ReleaseMemAddressRequest(address=address), site)
        self._allocations.release(address)

    # ---- physical memory -------------------------------------------------------------------------
    def _device_prop(self, prop: Any) -> tuple[int, int]:
        """(device, mem_attr) of an aclrtPhysicalMemProp dict, checked as ACL does."""
        if not isinstance(prop, dict):
            raise acl_param("prop must be an aclrtPhysicalMemProp dict")
        kind = _field(prop, "location", "type")
        attr = _field(prop, "mem_attr")
        if kind in (codes.ACL_MEM_LOCATION_TYPE_UNREGISTERED, codes.ACL_MEM_LOCATION_TYPE_MANAGED):
            raise acl_param(f"location type {kind} is not one physical memory can have")
        device_side = kind == codes.ACL_MEM_LOCATION_TYPE_DEVICE
        if (device_side and attr in _HOST_ONLY) or attr not in _MEM_ATTRS:
            raise acl_param(f"mem_attr {attr} is not supported for location type {kind}")
        if kind in _HOST_LOCATIONS:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "physical host memory is not simulated (device memory is: location type 1)",
            )
        if not device_side:
            raise invalid(f"location type {kind} does not exist")
        device = _field(prop, "location", "id")
        self._contexts.check_device(device)
        return device, attr

    @records_errors
    def mem_get_allocation_granularity(self, prop: Any, option: int) -> int:
        """aclrtMemGetAllocationGranularity: 2 MiB (1 GiB for the 1G huge-page attributes),
        minimum and recommended alike."""
        _, attr = self._device_prop(prop)
        if option not in (
            codes.ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM,
            codes.ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        ):
            raise invalid(f"granularity option {option} does not exist")
        return GRANULARITY_1G if attr in _HUGE_1G else GRANULARITY

    @records_errors
    def malloc_physical(self, size: int, prop: Any, flags: int = 0, site: str | None = None) -> int:
        """aclrtMallocPhysical: a handle of `size` bytes of device memory (rounded up to the
        granularity), committed now, counted as this process's memory. Blocks."""
        if prop is None:
            raise acl_param("null prop passed to malloc_physical")
        if size <= 0:
            raise acl_param(f"cannot allocate {size} bytes of physical memory")
        if flags:
            raise acl_param(f"flags {flags}: must be 0")
        check_allocatable(size, "physical memory")
        if _field(prop, "handle_type") != codes.ACL_MEM_HANDLE_TYPE_NONE:
            raise acl_param("prop handle_type must be ACL_MEM_HANDLE_TYPE_NONE (0)")
        if _field(prop, "allocation_type") != codes.ACL_MEM_ALLOCATION_TYPE_PINNED:
            raise acl_param("prop allocation_type must be ACL_MEM_ALLOCATION_TYPE_PINNED (0)")
        device, attr = self._device_prop(prop)
        request = pb.MallocPhysicalRequest(device=device, size=size, mem_attr=attr)
        reply = self._calls.request(request, site)
        with self._lock:
            self._physical[reply.handle] = [reply.size, device, attr, 1]
        return reply.handle

    @records_errors
    def free_physical(self, handle: int, site: str | None = None) -> None:
        """aclrtFreePhysical: drops the handle (a retained one once per retain); the memory
        goes once nothing maps it. Blocks."""
        if not handle:
            raise acl_param("null handle passed to free_physical")
        self._handle(handle)
        self._calls.request(pb.FreePhysicalRequest(handle=handle), site)
        with self._lock:
            entry = self._physical[handle]
            entry[3] -= 1
            if not entry[3]:
                del self._physical[handle]

    def _handle(self, handle: int) -> list[int]:
        """[size, device, mem_attr, references] of physical handle `handle` (107000 for one
        that is not this process's)."""
        entry = self._physical.get(handle)
        if entry is None:
            raise invalid(f"{handle:#x} is not a physical memory handle of this process")
        return entry

    @records_errors
    def mem_get_allocation_properties_from_handle(self, handle: int) -> dict:
        """aclrtMemGetAllocationPropertiesFromHandle: the aclrtPhysicalMemProp, as a dict."""
        if not handle:
            raise acl_param("null handle")
        _, device, attr, _ = self._handle(handle)
        return {
            "handle_type": codes.ACL_MEM_HANDLE_TYPE_NONE,
            "allocation_type": codes.ACL_MEM_ALLOCATION_TYPE_PINNED,
            "mem_attr": attr,
            "location": {"id": device, "type": codes.ACL_MEM_LOCATION_TYPE_DEVICE},
            "reserve": 0,
        }

    @records_errors
    def mem_retain_allocation_handle(self, address: int, site: str | None = None) -> int:
        """aclrtMemRetainAllocationHandle: the handle of the physical memory mapped at
        `address`, one more reference (free_physical drops it). Blocks."""
        if not address:
            raise acl_param("null pointer passed to mem_retain_allocation_handle")
        reply = self._calls.request(pb.RetainAllocationHandleRequest(address=address), site)
        with self._lock:
            entry = self._physical.setdefault(
                reply.handle, [reply.size, reply.device, reply.mem_attr, 0]
            )
            entry[3] += 1
        return reply.handle

    # ---- mappings --------------------------------------------------------------------------------
    @records_errors
    def map_mem(
        self,
        address: int,
        size: int,
        offset: int,
        handle: int,
        flags: int = 0,
        site: str | None = None,
    ) -> None:
        """aclrtMapMem: the whole of physical allocation `handle` at `address` of a reserved
        range; from now on device memory like aclrtMalloc's. Blocks."""
        if not address or not handle:
            raise acl_param("null pointer or handle passed to map_mem")
        if size <= 0:
            raise acl_param(f"cannot map {size} bytes")
        if flags:
            raise acl_param(f"flags {flags}: must be 0")
        self._handle(handle)
        wire_int(size, "size")
        wire_int(offset, "offset")
        request = pb.MapMemRequest(address=address, size=size, offset=offset, handle=handle)
        self._calls.request(request, site)
        self._allocations.map(address, size, handle)

    @records_errors
    def unmap_mem(self, address: int, site: str | None = None) -> None:
        """aclrtUnmapMem of the mapping that starts at `address` (tasks still queued on it
        are the program's use after unmap). Blocks."""
        if not address:
            raise acl_param("null pointer passed to unmap_mem")
        if not self._allocations.is_mapped(address):
            raise invalid(f"{address:#x} is not the start of memory this process mapped")
        self._calls.request(pb.UnmapMemRequest(address=address), site)
        self._allocations.unmap(address)

    # ---- access and attributes ----------------------------------------------------------------
    @records_errors
    def mem_set_access(self, address: int, size: int, desc: Any, count: int) -> None:
        """aclrtMemSetAccess of mapped memory: read-write access from devices, which every
        device has on the simulated NPU already (read-only and no access are 207000)."""
        if not address or desc is None:
            raise invalid("null pointer or descriptor passed to mem_set_access")
        descs = list(desc) if isinstance(desc, (list, tuple)) else [desc]
        if count <= 0 or count > len(descs):
            raise invalid(f"count {count} does not match the {len(descs)} descriptor(s)")
        if not self._allocations.mapped_range(address, size):
            raise _not_mapped(address)
        for entry in descs[:count]:
            flags = _field(entry, "flags")
            kind = _field(entry, "location", "type")
            if kind != codes.ACL_MEM_LOCATION_TYPE_DEVICE:
                raise invalid(f"location type {kind}: access is set for devices (type 1)")
            self._contexts.check_device(_field(entry, "location", "id"))
            if flags not in _ACCESS_FLAGS:
                raise invalid(f"access flags {flags} do not exist")
            if flags != codes.ACL_RT_MEM_ACCESS_FLAGS_READWRITE:
                raise NpuError(
                    codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                    "read-only or no access to mapped memory is not simulated: every "
                    "device reads and writes it",
                )

    @records_errors
    def mem_get_access(self, address: int, location: Any) -> int:
        """aclrtMemGetAccess: ACL_RT_MEM_ACCESS_FLAGS_READWRITE for mapped memory, from any
        device."""
        if not address or location is None:
            raise invalid("null pointer or location passed to mem_get_access")
        if self._allocations.mapping_at(address) is None:
            raise _not_mapped(address)
        if _field(location, "type") != codes.ACL_MEM_LOCATION_TYPE_DEVICE:
            raise invalid("access is reported for devices (location type 1)")
        self._contexts.check_device(_field(location, "id"))
        return codes.ACL_RT_MEM_ACCESS_FLAGS_READWRITE

    @records_errors
    def mem_get_address_range(self, address: int) -> tuple[int, int]:
        """aclrtMemGetAddressRange: (start, size) of the allocation, mapping or pinned host
        block holding `address`."""
        if not address:
            raise acl_param("null pointer passed to mem_get_address_range")
        found = self._block_at(address)
        if found is None:
            raise invalid(f"{address:#x} is not inside memory of this process")
        return found[0], found[1]

    @records_errors
    def pointer_get_attributes(self, address: int) -> dict:
        """aclrtPointerGetAttributes: {"location": {"id", "type"}, "page_size"} -- device
        memory (allocations and mappings), pinned host memory (type HOST), anything else
        (type UNREGISTERED)."""
        if not address:
            raise acl_param("null pointer passed to pointer_get_attributes")
        found = self._block_at(address)
        if found is None:
            kind, device, page = codes.ACL_MEM_LOCATION_TYPE_UNREGISTERED, 0, mmap.PAGESIZE
        elif found[2] < 0:
            kind, device, page = codes.ACL_MEM_LOCATION_TYPE_HOST, 0, mmap.PAGESIZE
        else:
            kind, device, page = codes.ACL_MEM_LOCATION_TYPE_DEVICE, found[2], found[3]
        return {"location": {"id": device, "type": kind}, "page_size": page}

    def _block_at(self, address: int) -> tuple[int, int, int, int] | None:
        """(start, size, device or -1 for host, page size) of what holds `address`."""
        if not is_device_address(address):
            block = self._host.find(address)
            return None if block is None else (block.address, block.size, -1, mmap.PAGESIZE)
        mapping = self._allocations.mapping_at(address)
        if mapping is not None:
            start, size, handle = mapping
            attr = self._physical[handle][2] if handle in self._physical else 0
            page = GRANULARITY_1G if attr in _HUGE_1G else GRANULARITY
            return start, size, split_device_address(start)[0], page
        allocation = self._allocations.allocation_at(address)
        if allocation is not None:
            start, size, device = allocation
            return start, size, device, mmap.PAGESIZE
        return None

    # ---- shareable handles ---------------------------------------------------------------------
    @records_errors
    def mem_export_to_shareable_handle(
        self, handle: int, handle_type: int, flags: int, site: str | None = None
    ) -> int:
        """aclrtMemExportToShareableHandle: the shareable handle of physical memory this
        process allocated, for other processes of the daemon. flags: 0 (only pids set with
        mem_set_pid_to_shareable_handle import) or ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION
        (1). Blocks."""
        if not handle:
            raise acl_param("null handle passed to mem_export_to_shareable_handle")
        if handle_type != codes.ACL_MEM_HANDLE_TYPE_NONE:
            raise acl_param("handle_type must be ACL_MEM_HANDLE_TYPE_NONE (0)")
        self._handle(handle)
        wire_int(flags, "flags")
        request = pb.ExportShareableRequest(handle=handle, flags=flags)
        return self._calls.request(request, site).shareable

    @records_errors
    def mem_export_to_shareable_handle_v2(
        self, handle: int, flags: int, share_type: int, site: str | None = None
    ) -> int:
        """aclrtMemExportToShareableHandleV2 (DEFAULT share type: a 64-bit number). Blocks."""
        if not handle:
            raise acl_param("null handle passed to mem_export_to_shareable_handle_v2")
        _share_type(share_type)
        self._handle(handle)
        wire_int(flags, "flags")
        request = pb.ExportShareableRequest(handle=handle, flags=flags)
        return self._calls.request(request, site).shareable

    @records_errors
    def mem_set_pid_to_shareable_handle(
        self, shareable: int, pids: list[int], site: str | None = None
    ) -> None:
        """aclrtMemSetPidToShareableHandle: whitelist processes (their
        device_get_bare_tgid) for `shareable`. Blocks."""
        if not pids:
            raise acl_param("mem_set_pid_to_shareable_handle needs at least one pid")
        pids = [wire_int(pid, "pid") for pid in pids]
        self._calls.request(pb.SetShareablePidsRequest(shareable=shareable, pids=pids), site)

    @records_errors
    def mem_set_pid_to_shareable_handle_v2(
        self, shareable: int, share_type: int, pids: list[int], site: str | None = None
    ) -> None:
        """aclrtMemSetPidToShareableHandleV2. Blocks."""
        if not shareable or not pids:
            raise acl_param("mem_set_pid_to_shareable_handle_v2 needs a handle and pids")
        _share_type(share_type)
        pids = [wire_int(pid, "pid") for pid in pids]
        self._calls.request(pb.SetShareablePidsRequest(shareable=shareable, pids=pids), site)

    @records_errors
    def mem_import_from_shareable_handle(
        self, shareable: int, device: int, site: str | None = None
    ) -> int:
        """aclrtMemImportFromShareableHandle: this process's handle of the physical memory
        another process exported, for `device` (the memory's own). Blocks."""
        self._contexts.check_device(device)
        return self._import(shareable, device, site)

    @records_errors
    def mem_import_from_shareable_handle_v2(
        self, shareable: int, share_type: int, flags: int, site: str | None = None
    ) -> int:
        """aclrtMemImportFromShareableHandleV2, for the current device. Blocks."""
        if not shareable:
            raise acl_param("null shareable handle passed to mem_import_from_shareable_handle_v2")
        if flags:
            raise acl_param(f"flags {flags}: must be 0")
        _share_type(share_type)
        return self._import(shareable, self._contexts.current().device, site)

    def _import(self, shareable: int, device: int, site: str | None) -> int:
        request = pb.ImportShareableRequest(shareable=shareable, device=device)
        reply = self._calls.request(request, site)
        with self._lock:
            self._physical[reply.handle] = [reply.size, reply.device, reply.mem_attr, 1]
        return reply.handle
