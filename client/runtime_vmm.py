"""The raw layer's virtual-memory calls: reserved address ranges, physical allocations,
mappings, access, and what a pointer is (aclrtReserveMemAddress, aclrtMallocPhysical,
aclrtMapMem, aclrtPointerGetAttributes...).

A mixin of `Runtime` (client/runtime.py). It keeps this process's reserved ranges, physical
handles and mappings, so that copies, memsets, launches and collectives on mapped memory
are checked without a round trip (`mapped_range`), like aclrtMalloc memory. The daemon's
side is server/virtual_memory.py; the design is in docs/device-memory.md.
"""

from __future__ import annotations

import bisect
import mmap
from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime_memory import check_allocatable, wire_int
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError, invalid
from simnpu.shm.addresses import is_device_address, split_device_address

if TYPE_CHECKING:
    import threading

    from google.protobuf.message import Message

    from simnpu.client.hostmem import HostMemory
    from simnpu.client.runtime import ContextInfo

GRANULARITY = 2 << 20  # every attribute's but the 1 GiB huge pages' (server/virtual_memory.py)
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


def _param(message: str) -> NpuError:
    """ACL's own parameter check failed (100000)."""
    return NpuError(codes.ACL_ERROR_INVALID_PARAM, message)


def _field(value: Any, *path: str) -> int:
    """An int field of an ACL struct given as a dict (absent: 0, as in a zeroed struct)."""
    for key in path:
        if isinstance(value, dict):
            value = value.get(key, 0)
        elif value != 0:
            raise _param(f"{key} must be in a dict (an ACL struct), not {value!r}")
    if not isinstance(value, int):
        raise _param(f"{'.'.join(path)} must be an int, not {value!r}")
    return value


def _not_mapped(address: int) -> NpuError:
    return invalid(f"{address:#x} is not inside memory this process mapped")


class RuntimeVirtualMemory:
    # what the mixin uses of Runtime (client/runtime.py), which sets and defines all of it
    _lock: threading.Lock
    device_count: int
    allocation_starts: list[int]
    allocations: dict[int, tuple[int, int]]  # address -> (size, device)
    host: HostMemory
    reserved: dict[int, tuple[int, int]]  # start -> (size, device)
    reserved_starts: list[int]
    mappings: dict[int, tuple[int, int]]  # start -> (size, physical handle)
    mapping_starts: list[int]
    physical: dict[int, list[int]]  # handle -> [size, device, mem_attr, references]

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _current(self) -> ContextInfo: ...
        def _check_device(self, device: int) -> None: ...

    # ---- reserved ranges -----------------------------------------------------------------------
    @records_errors
    def reserve_mem_address(
        self, size: int, alignment: int = 0, expect_ptr: int = 0, flags: int = 0
    ) -> int:
        """aclrtReserveMemAddress: the start of `size` bytes of device address space on the
        current device (rounded up to 2 MiB), nothing behind it. Blocks."""
        if size <= 0:
            raise _param(f"cannot reserve {size} bytes")
        if flags not in (0, 1):
            raise _param(f"flags {flags}: only 0 (or 1, kept for compatibility) is allowed")
        check_allocatable(size, "device address space")
        wire_int(alignment, "alignment")
        device = self._current().device
        reply = self._call(
            pb.ReserveMemAddressRequest(
                device=device, size=size, alignment=alignment, expect=expect_ptr
            )
        )
        with self._lock:
            self.reserved[reply.address] = (reply.size, device)
            bisect.insort(self.reserved_starts, reply.address)
        return reply.address

    @records_errors
    def reserve_mem_address_no_uc_memory(
        self, size: int, alignment: int, expect_ptr: int, flags: int
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
        return self.reserve_mem_address(size, alignment, expect_ptr, flags)

    @records_errors
    def release_mem_address(self, address: int) -> None:
        """aclrtReleaseMemAddress of a range with nothing mapped in it. Blocks."""
        if not address:
            raise _param("null pointer passed to release_mem_address")
        if address not in self.reserved:
            raise invalid(f"{address:#x} is not the start of a range this process reserved")
        self._call(pb.ReleaseMemAddressRequest(address=address))
        with self._lock:
            del self.reserved[address]
            self.reserved_starts.remove(address)

    # ---- physical memory -------------------------------------------------------------------------
    def _device_prop(self, prop: Any) -> tuple[int, int]:
        """(device, mem_attr) of an aclrtPhysicalMemProp dict, checked as ACL does."""
        if not isinstance(prop, dict):
            raise _param("prop must be an aclrtPhysicalMemProp dict")
        kind = _field(prop, "location", "type")
        attr = _field(prop, "mem_attr")
        if kind in (codes.ACL_MEM_LOCATION_TYPE_UNREGISTERED, codes.ACL_MEM_LOCATION_TYPE_MANAGED):
            raise _param(f"location type {kind} is not one physical memory can have")
        device_side = kind == codes.ACL_MEM_LOCATION_TYPE_DEVICE
        if (device_side and attr in _HOST_ONLY) or attr not in _MEM_ATTRS:
            raise _param(f"mem_attr {attr} is not supported for location type {kind}")
        if kind in _HOST_LOCATIONS:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "physical host memory is not simulated (device memory is: location type 1)",
            )
        if not device_side:
            raise invalid(f"location type {kind} does not exist")
        device = _field(prop, "location", "id")
        self._check_device(device)
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
    def malloc_physical(self, size: int, prop: Any, flags: int = 0) -> int:
        """aclrtMallocPhysical: a handle of `size` bytes of device memory (rounded up to the
        granularity), committed now, counted as this process's memory. Blocks."""
        if prop is None:
            raise _param("null prop passed to malloc_physical")
        if size <= 0:
            raise _param(f"cannot allocate {size} bytes of physical memory")
        if flags:
            raise _param(f"flags {flags}: must be 0")
        check_allocatable(size, "physical memory")
        if _field(prop, "handle_type") != codes.ACL_MEM_HANDLE_TYPE_NONE:
            raise _param("prop handle_type must be ACL_MEM_HANDLE_TYPE_NONE (0)")
        if _field(prop, "allocation_type") != codes.ACL_MEM_ALLOCATION_TYPE_PINNED:
            raise _param("prop allocation_type must be ACL_MEM_ALLOCATION_TYPE_PINNED (0)")
        device, attr = self._device_prop(prop)
        reply = self._call(pb.MallocPhysicalRequest(device=device, size=size, mem_attr=attr))
        with self._lock:
            self.physical[reply.handle] = [reply.size, device, attr, 1]
        return reply.handle

    @records_errors
    def free_physical(self, handle: int) -> None:
        """aclrtFreePhysical: drops the handle (a retained one once per retain); the memory
        goes once nothing maps it. Blocks."""
        if not handle:
            raise _param("null handle passed to free_physical")
        self._physical(handle)
        self._call(pb.FreePhysicalRequest(handle=handle))
        with self._lock:
            entry = self.physical[handle]
            entry[3] -= 1
            if not entry[3]:
                del self.physical[handle]

    def _physical(self, handle: int) -> list[int]:
        entry = self.physical.get(handle)
        if entry is None:
            raise invalid(f"{handle:#x} is not a physical memory handle of this process")
        return entry

    @records_errors
    def mem_get_allocation_properties_from_handle(self, handle: int) -> dict:
        """aclrtMemGetAllocationPropertiesFromHandle: the aclrtPhysicalMemProp, as a dict."""
        if not handle:
            raise _param("null handle")
        _, device, attr, _ = self._physical(handle)
        return {
            "handle_type": codes.ACL_MEM_HANDLE_TYPE_NONE,
            "allocation_type": codes.ACL_MEM_ALLOCATION_TYPE_PINNED,
            "mem_attr": attr,
            "location": {"id": device, "type": codes.ACL_MEM_LOCATION_TYPE_DEVICE},
            "reserve": 0,
        }

    @records_errors
    def mem_retain_allocation_handle(self, address: int) -> int:
        """aclrtMemRetainAllocationHandle: the handle of the physical memory mapped at
        `address`, one more reference (free_physical drops it). Blocks."""
        if not address:
            raise _param("null pointer passed to mem_retain_allocation_handle")
        reply = self._call(pb.RetainAllocationHandleRequest(address=address))
        with self._lock:
            entry = self.physical.setdefault(
                reply.handle, [reply.size, reply.device, reply.mem_attr, 0]
            )
            entry[3] += 1
        return reply.handle

    # ---- mappings --------------------------------------------------------------------------------
    @records_errors
    def map_mem(self, address: int, size: int, offset: int, handle: int, flags: int = 0) -> None:
        """aclrtMapMem: the whole of physical allocation `handle` at `address` of a reserved
        range; from now on device memory like aclrtMalloc's. Blocks."""
        if not address or not handle:
            raise _param("null pointer or handle passed to map_mem")
        if size <= 0:
            raise _param(f"cannot map {size} bytes")
        if flags:
            raise _param(f"flags {flags}: must be 0")
        self._physical(handle)
        wire_int(size, "size")
        wire_int(offset, "offset")
        self._call(pb.MapMemRequest(address=address, size=size, offset=offset, handle=handle))
        with self._lock:
            self.mappings[address] = (size, handle)
            bisect.insort(self.mapping_starts, address)

    @records_errors
    def unmap_mem(self, address: int) -> None:
        """aclrtUnmapMem of the mapping that starts at `address` (tasks still queued on it
        are the program's use after unmap). Blocks."""
        if not address:
            raise _param("null pointer passed to unmap_mem")
        if address not in self.mappings:
            raise invalid(f"{address:#x} is not the start of memory this process mapped")
        self._call(pb.UnmapMemRequest(address=address))
        with self._lock:
            del self.mappings[address]
            self.mapping_starts.remove(address)

    def _mapping_at(self, address: int) -> int | None:
        index = bisect.bisect_right(self.mapping_starts, address) - 1
        if index >= 0:
            start = self.mapping_starts[index]
            if address < start + self.mappings[start][0]:
                return start
        return None

    def _reservation_at(self, address: int) -> int | None:
        index = bisect.bisect_right(self.reserved_starts, address) - 1
        if index >= 0:
            start = self.reserved_starts[index]
            if address < start + self.reserved[start][0]:
                return start
        return None

    def mapped_range(self, address: int, count: int) -> bool:
        """Does [address, +count) lie in mapped memory of this process (mappings side by
        side count as one buffer)? False outside reserved ranges; 507053 naming the range
        for an address of a reserved range where nothing is mapped; 107000 for a range that
        runs past the mapped part."""
        reservation = self._reservation_at(address) if self.reserved_starts else None
        if reservation is None:
            return False
        start = self._mapping_at(address)
        if start is None:
            raise NpuError(
                codes.ACL_ERROR_RT_DEVICE_MEM_ERROR,
                f"memory fault: {address:#x} lies in the reserved range "
                f"[{reservation:#x}, +{self.reserved[reservation][0]}) where nothing is mapped",
            )
        end = start + self.mappings[start][0]
        while end < address + count and end in self.mappings:
            end += self.mappings[end][0]
        if address + count > end:
            raise invalid(
                f"{count} bytes at {address:#x} run past the end of the mapped memory "
                f"(it ends at {end:#x})"
            )
        return True

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
        if not self.mapped_range(address, size):
            raise _not_mapped(address)
        for entry in descs[:count]:
            flags = _field(entry, "flags")
            kind = _field(entry, "location", "type")
            if kind != codes.ACL_MEM_LOCATION_TYPE_DEVICE:
                raise invalid(f"location type {kind}: access is set for devices (type 1)")
            self._check_device(_field(entry, "location", "id"))
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
        if self._mapping_at(address) is None:
            raise _not_mapped(address)
        if _field(location, "type") != codes.ACL_MEM_LOCATION_TYPE_DEVICE:
            raise invalid("access is reported for devices (location type 1)")
        self._check_device(_field(location, "id"))
        return codes.ACL_RT_MEM_ACCESS_FLAGS_READWRITE

    @records_errors
    def mem_get_address_range(self, address: int) -> tuple[int, int]:
        """aclrtMemGetAddressRange: (start, size) of the allocation, mapping or pinned host
        block holding `address`."""
        if not address:
            raise _param("null pointer passed to mem_get_address_range")
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
            raise _param("null pointer passed to pointer_get_attributes")
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
            block = self.host.find(address)
            return None if block is None else (block.address, block.size, -1, mmap.PAGESIZE)
        start = self._mapping_at(address) if self.mapping_starts else None
        if start is not None:
            size, handle = self.mappings[start]
            attr = self.physical[handle][2] if handle in self.physical else 0
            page = GRANULARITY_1G if attr in _HUGE_1G else GRANULARITY
            return start, size, split_device_address(start)[0], page
        index = bisect.bisect_right(self.allocation_starts, address) - 1
        if index >= 0:
            start = self.allocation_starts[index]
            size, device = self.allocations[start]
            if address < start + size:
                return start, size, device, mmap.PAGESIZE
        return None
