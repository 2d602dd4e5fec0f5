"""rt.host: pinned host memory (aclrtMallocHost, aclrtFreeHost, aclrtFreeHostWithDevSync)
and the registration that lets kernels reach it (aclrtHostRegister(V2),
aclrtHostGetDevicePointer, aclrtHostUnregister). Managed memory is pinned memory registered
whole (client/runtime/managed_memory.py allocates it here).

Pinned memory is a shared segment the daemon creates and this process maps (client/hostmem.py
keeps the blocks), or private memory when the daemon's /dev/shm is out of reach. Only pinned
memory in shared memory can be registered: it is a segment the daemon, its workers and this
client's kernel processes map, at a device address range the daemon gives it
(server/memory/registered_memory.py, docs/device-memory.md); that range joins the allocation index.
Private host memory cannot be mapped by another process: 207000.
"""

from __future__ import annotations

import bisect
import threading
from typing import TYPE_CHECKING

from simnpu.client.last_error import records_errors
from simnpu.client.runtime.allocation_index import SortedRanges
from simnpu.client.runtime.arguments import acl_param, check_allocatable, wire_int
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NotSupportedError, NpuError, invalid

if TYPE_CHECKING:
    from simnpu.client.hostmem import PinnedBlock
    from simnpu.client.runtime.shared import Shared
    from simnpu.client.runtime.synchronization import Synchronization

_V1_TYPES = codes.ACL_HOST_REGISTER_IOMEMORY | codes.ACL_HOST_REGISTER_READONLY
_V2_FLAGS = (
    codes.ACL_HOST_REG_MAPPED
    | codes.ACL_HOST_REG_IOMEMORY
    | codes.ACL_HOST_REG_READONLY
    | codes.ACL_HOST_REG_PINNED
)
_V2_MAPPED = codes.ACL_HOST_REG_MAPPED | codes.ACL_HOST_REG_IOMEMORY | codes.ACL_HOST_REG_READONLY


class PinnedMemory:
    """Pinned and registered host memory calls (see the module docstring)."""

    def __init__(self, shared: Shared, sync: Synchronization, in_shared_memory: bool):
        self._calls, self._contexts = shared.calls, shared.contexts
        self._host, self._allocations = shared.host, shared.allocations
        self._sync = sync
        self.shared = in_shared_memory  # pinned memory is shared with the daemon (else private)
        self._lock = threading.Lock()
        self._registered = SortedRanges()  # host start -> (size, device pointer or 0)
        self._managed: set[int] = set()  # host starts of managed memory

    # ---- pinned memory -------------------------------------------------------------------------
    def find(self, address: int) -> PinnedBlock | None:
        """The pinned block of this process holding `address`, if any."""
        return self._host.find(address)

    @records_errors
    def malloc_host(self, size: int, site: str | None = None) -> int:
        """aclrtMallocHost: page-locked host memory; the address is usable with ctypes/numpy.
        Blocks."""
        if not isinstance(size, int) or size <= 0:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size!r} bytes of host memory"
            )
        check_allocatable(size, "pinned host memory")
        if not self.shared:
            return self._host.add_private(0, size).address
        reply = self._calls.request(pb.MallocHostRequest(size=size), site)
        return self._host.add_shared(reply.segment, size, reply.name).address

    @records_errors
    def free_host(self, address: int, site: str | None = None) -> None:
        """aclrtFreeHost. Blocks."""
        if not address:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to free_host")
        block = self._host.find(address)
        if block is None or block.address != address:
            raise invalid(f"{address:#x} is not the start of pinned host memory of this process")
        if self.is_managed(address):
            raise invalid(f"{address:#x} is managed memory: free it with aclrtFree")
        self._unregister_block(address, block.size)  # its registrations go with it
        self._host.remove(address)
        if block.region is not None:
            self._calls.request(pb.FreeHostRequest(segment=block.handle), site)
            try:
                block.region.close()
            except BufferError:  # numpy views still alive: the mapping goes when they do
                pass

    @records_errors
    def free_host_with_dev_sync(self, address: int, site: str | None = None) -> None:
        """aclrtFreeHostWithDevSync: wait for the current device's work, then free the pinned
        block. Blocks."""
        if not address:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "null pointer passed to free_host")
        self._sync.synchronize_device(-1)
        self.free_host(address, site)

    # ---- registration ---------------------------------------------------------------------------
    @records_errors
    def host_register(self, ptr: int, size: int, kind: int, site: str | None = None) -> int:
        """aclrtHostRegister: the device pointer of `[ptr, +size)` of pinned memory, which
        kernels, copies and memsets then reach without copies. Blocks."""
        if not ptr or size <= 0:
            raise acl_param("null pointer or size 0 passed to host_register")
        wire_int(size, "size")
        if kind & ~_V1_TYPES:
            raise NotSupportedError(
                f"aclrtHostRegister type {kind}: only combinations of "
                "ACL_HOST_REGISTER_IOMEMORY and _READONLY, or 0"
            )
        return self._register(ptr, size, True, False, site)

    @records_errors
    def host_register_v2(self, ptr: int, size: int, flag: int, site: str | None = None) -> None:
        """aclrtHostRegisterV2: register `[ptr, +size)` of pinned memory; with
        ACL_HOST_REG_MAPPED (or _IOMEMORY, _READONLY) it gets a device pointer
        (host_get_device_pointer). Blocks."""
        if not ptr or size <= 0:
            raise acl_param("null pointer or size 0 passed to host_register_v2")
        wire_int(size, "size")
        if not flag & _V2_FLAGS or flag & ~_V2_FLAGS:
            raise invalid(
                f"flag {flag:#x}: an OR of ACL_HOST_REG_MAPPED (0x2), _IOMEMORY (0x4), "
                "_READONLY (0x8) and _PINNED (0x10000000)"
            )
        self._register(ptr, size, bool(flag & _V2_MAPPED), False, site)

    def _register(self, ptr: int, size: int, mapped: bool, managed: bool, site) -> int:
        block = self._host.find(ptr)
        if block is None or ptr + size > block.address + block.size:
            raise NotSupportedError(
                f"registering [{ptr:#x}, +{size}): only pinned memory (aclrtMallocHost) can "
                "be registered; another process cannot map a private page of this one"
            )
        if block.region is None:
            raise NotSupportedError(
                f"registering [{ptr:#x}, +{size}): this client has no shared memory with the "
                "daemon (pinned memory is private here), so no device can reach its memory"
            )
        with self._lock:
            starts, registered = self._registered.starts, self._registered.values
            index = bisect.bisect_right(starts, ptr + size - 1) - 1
            if index >= 0:
                start = starts[index]
                if ptr < start + registered[start][0]:
                    raise NpuError(
                        codes.ACL_ERROR_RT_HOST_MEMORY_ALREADY_REGISTERED,
                        f"[{ptr:#x}, +{size}) overlaps host memory registered already "
                        f"([{start:#x}, +{registered[start][0]}))",
                    )
            self._registered.add(ptr, (size, 0))
        address = 0
        if mapped:
            try:
                reply = self._calls.request(
                    pb.HostRegisterRequest(
                        segment=block.handle,
                        offset=ptr - block.address,
                        size=size,
                        device=self._contexts.current().device,
                        host=ptr,
                        managed=managed,
                    ),
                    site,
                )
            except BaseException:
                self._forget_registration(ptr)
                raise
            address = reply.address
            with self._lock:
                self._registered.add(ptr, (size, address))
                self._allocations.add_registered(address, size)
        return address

    @records_errors
    def host_get_device_pointer(self, ptr: int, flag: int) -> int:
        """aclrtHostGetDevicePointer: the device pointer of registered host address `ptr`
        (any byte of a range registered with a device mapping). Never waits."""
        if not ptr:
            raise acl_param("null pointer passed to host_get_device_pointer")
        if flag != 0:
            raise acl_param(f"flag {flag}: must be 0")
        start = self._registered_at(ptr)
        if start is None or not self._registered.values[start][1]:
            raise invalid(f"{ptr:#x} has not been registered for device address mapping")
        return self._registered.values[start][1] + ptr - start

    @records_errors
    def host_unregister(self, ptr: int, site: str | None = None) -> None:
        """aclrtHostUnregister of the start of a registered range. Blocks."""
        if not ptr:
            raise acl_param("null pointer passed to host_unregister")
        if ptr not in self._registered.values or ptr in self._managed:
            raise NpuError(
                codes.ACL_ERROR_RT_HOST_MEMORY_NOT_REGISTERED,
                f"{ptr:#x} is not the start of host memory this process registered",
            )
        self._unregister(ptr, site)

    def _unregister(self, ptr: int, site: str | None) -> None:
        address = self._forget_registration(ptr)
        if address:
            self._calls.request(pb.HostUnregisterRequest(address=address), site)

    def _forget_registration(self, ptr: int) -> int:
        with self._lock:
            address = self._registered.values[ptr][1]
            self._registered.remove(ptr)
            if address:
                self._allocations.remove_registered(address)
        return address

    def _registered_at(self, ptr: int) -> int | None:
        return self._registered.holding(ptr)

    def _unregister_block(self, address: int, size: int) -> None:
        """Pinned memory `[address, +size)` is being freed: its registrations go with it
        (the daemon retires them too)."""
        if not self._registered.starts:
            return
        for start in [s for s in self._registered.starts if address <= s < address + size]:
            self._forget_registration(start)
            self._managed.discard(start)

    # ---- managed memory (client/runtime/managed_memory.py) -----------------------------------
    def register_managed(self, ptr: int, size: int, site: str | None) -> None:
        """The pinned block `[ptr, +size)` becomes managed memory: registered whole, with a
        device pointer."""
        self._register(ptr, size, True, True, site)
        self._managed.add(ptr)

    def is_managed(self, ptr: int) -> bool:
        """Is `ptr` the start of managed memory of this process?"""
        return ptr in self._managed

    def managed_block(self, ptr: int, size: int) -> tuple[int, int]:
        """(start, size) of the managed block `[ptr, +size)` lies in; 107000 when it is not
        all managed memory of this process (the driver's check)."""
        start = self._registered_at(ptr)
        if start is None or start not in self._managed:
            raise invalid(f"{ptr:#x} is not managed memory of this process (aclrtMemAllocManaged)")
        block = self._registered.values[start][0]
        if ptr + size > start + block:
            raise invalid(
                f"{size} bytes at {ptr:#x} run past the end of managed memory "
                f"[{start:#x}, +{block})"
            )
        return start, block

    def release_managed(self, ptr: int, site: str | None) -> None:
        """Managed memory at `ptr` goes: unregister it and free its pinned memory. Blocks."""
        self._managed.discard(ptr)
        self._unregister(ptr, site)
        self.free_host(ptr, site)
