"""The device memory of one client: its own blocks, what it imported through IPC, its
limits, the blocks of its stream-ordered pools (docs/memory.md), and its virtual memory
(reserved ranges, physical blocks, mappings: server/memory/virtual_memory.py).

The session's memory handlers work on it; every call that names device memory has its range
checked here (`device_range`), and its kernel launches see it through `arguments`
(server/memory/launch_arguments.py). Blocks belong to the client's `Owner` in the device
allocators, and IPC exports name it too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.core.unit_protocol import Grant, Span, page_spans
from simnpu.server.memory import quotas
from simnpu.server.memory.host_memory import committed_failure
from simnpu.server.memory.launch_arguments import LaunchArguments
from simnpu.server.memory.registered_memory import RegisteredMemory
from simnpu.server.memory.virtual_memory import VirtualMemory
from simnpu.shm.addresses import is_device_address, split_device_address
from simnpu.shm.allocator import Allocation

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.server.memory.device_memory import DeviceWithMemory
    from simnpu.server.memory.ipc_memory import IpcMemory
    from simnpu.server.memory.mem_pools import MemPool

log = logging.getLogger("simnpu.memory")


class ClientMemory:
    def __init__(
        self,
        owner: Owner,
        devices: list[DeviceWithMemory],
        ipc: IpcMemory,
        default_limit: int | None,
    ):
        self.owner = owner
        self._devices = devices
        self._ipc = ipc
        self.allocations: dict[int, int] = {}  # device address -> device of its own live blocks
        self.imported: dict[str, tuple[int, int, int]] = {}  # IPC key -> (address, size, device)
        self.limits = quotas.Limits(default_limit, len(devices))
        self.pools: set[MemPool] = set()  # its live pools
        self.pool_blocks: dict[int, MemPool] = {}  # address -> its pool, until its FreeAsync
        self.virtual = VirtualMemory(owner, devices, self.limits)
        self.registered = RegisteredMemory(owner, devices)  # aliases of its pinned memory
        self._grant = Grant(-1, ())
        owner.kernel_grant = self.kernel_grant
        self.arguments = LaunchArguments(self, devices)  # what its launches' pointers reach

    # ---- blocks ---------------------------------------------------------------------------------
    def allocate(self, device: DeviceWithMemory, size: int, policy: int) -> int:
        """aclrtMalloc on `device` under this client's limit: the new block's address."""
        if size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size} bytes")
        address = device.allocate(
            size, policy, self.owner, self.limits.of(device.index), keep_reserve=True
        )
        self.allocations[address] = device.index
        self.owner.memory_generation += 1  # after the block is listed: see kernel_grant
        return address

    def free(self, address: int) -> None:
        """aclrtFree of one of its own blocks (not a pool's, not an import)."""
        if address in self.pool_blocks:
            raise invalid(
                f"{address:#x} comes from a memory pool: free it with aclrtMemPoolFreeAsync"
            )
        device = self.allocations.pop(address, None)
        if device is None:
            if any(start == address for start, _, _ in self.imported.values()):
                raise invalid(
                    f"{address:#x} is imported IPC memory: release it with aclrtIpcMemClose"
                )
            other = self.owner_of(address)
            if other is not None:  # who it belongs to: told the daemon's owner only
                self.owner.lines.info(
                    log, "%r: aclrtFree of %#x, an allocation of %r", self.owner, address, other
                )
            raise invalid(
                f"{address:#x} is not the start of a live allocation of this process"
                + (" (it belongs to another client)" if other else " (double free or bad pointer)")
            )
        self.release_block(address, device)

    def mem_info(self, device: DeviceWithMemory) -> tuple[int, int]:
        """aclrtGetMemInfo on `device`: (free, total) bytes as this client sees them, under
        its limit (quotas.mem_info)."""
        with device.lock:
            free_bytes, used = device.allocator.free_bytes, device.allocator.used_by(self.owner)
        return quotas.mem_info(self.limits.of(device.index), used, free_bytes, device.capacity)

    def release_block(self, address: int, device: int) -> None:
        """Back to the allocator, unless IPC importers still hold it
        (server/memory/ipc_memory.py)."""
        if not self._ipc.owner_frees(self.owner, address):
            self._devices[device].free(address)

    def release_all(self) -> None:
        """The session ends: free its blocks (IPC rules apply), close its imports."""
        for address, device in list(self.allocations.items()):
            self.release_block(address, device)
        self.allocations.clear()
        self.pool_blocks.clear()
        self._ipc.session_ended(self.owner, list(self.imported))
        self.imported.clear()
        self.virtual.release_all()
        self.registered.release_all()
        for each in self._devices:  # the files of its memory go (once IPC lets them)
            each.owner_gone(self.owner)

    def share(
        self,
        device: int,
        address: int,
        length: int,
        quiet: Callable[[Owner], AbstractContextManager[None]],
    ) -> None:
        """An export of `[address, +length)` of its own memory on `device`
        (aclrtIpcMemGetExportKey, aclrtMemExportToShareableHandle): its pages move into a
        file of their block's own while none of this client's work runs (`quiet`:
        Scheduler.quiet), so that an importer maps nothing else of this client
        (docs/kernel-isolation.md). Blocks until then, at the block's first export only;
        207001 if the host has no memory for the file."""
        memory = self._devices[device]
        if not memory.unshared(address, length):
            return
        try:
            with quiet(self.owner):
                memory.share(address, length, self.owner)
        except OSError as error:
            raise committed_failure(length, error) from None

    def imported_now(self, key: str, address: int, size: int, device: int) -> None:
        """aclrtIpcMemImportByKey succeeded: `[address, +size)` of `device` is usable."""
        self.imported[key] = (address, size, device)
        self.owner.memory_generation += 1

    def import_closed(self, key: str) -> None:
        """aclrtIpcMemClose closed the last import of `key`."""
        self.imported.pop(key, None)
        self.owner.memory_generation += 1

    def kernel_grant(self) -> Grant:
        """The pages a process running this client's own kernels maps: its blocks, its IPC
        imports, its physical blocks and where they are mapped (docs/kernel-isolation.md).
        Called with the kernel processes' lock held, which frees of device memory take
        first."""
        generation = self.owner.memory_generation  # read first: a change since recomputes
        if self._grant.generation == generation:
            return self._grant
        ranges = []
        for address, device in self.allocations.copy().items():
            allocation = self._devices[device].lookup(address)
            if allocation is not None and allocation.owner is self.owner:
                ranges.append((device, allocation.offset, allocation.reserved))
        for address, size, device in list(self.imported.values()):
            ranges.append((device, split_device_address(address)[1], size))
        blocks, physical = self.virtual.grant()
        spans = page_spans(ranges + blocks)
        mappings = [  # from the files that back them: nobody else's pages come with them
            (device, start, size, start, file)
            for device, offset, length in spans
            for start, size, file in self._devices[device].backing.sources(offset, length)
        ]
        for device, offset, length, block, _ in physical:
            for start, size, file in self._devices[device].backing.sources(block, length):
                mappings.append((device, offset + start - block, size, start, file))
        mappings += self.registered.grant()
        self._grant = Grant(generation, spans, tuple(mappings))
        return self._grant

    # ---- addresses -------------------------------------------------------------------------------
    def allocation_at(self, address: int) -> Allocation | None:
        """The live allocation (of any client) holding device address `address`, if any."""
        if not is_device_address(address):
            return None
        device, _ = split_device_address(address)
        if device >= len(self._devices):
            return None
        return self._devices[device].lookup(address)

    def own_allocation(self, address: int) -> tuple[int, int] | None:
        """(start, requested size) of the allocation holding `address` that this client may
        use: its own, a range it imported, registered host memory, or mapped memory (the
        mappings side by side that hold it). Never a physical block's own address: those
        are used through mappings."""
        allocation = self.allocation_at(address)
        if allocation is None:
            return self.virtual.mapped_run(address) or self.registered.run(address)
        if allocation.owner is not self.owner or self._is_physical(address, allocation):
            return self.imported_range(address) if self.imported else None
        return address - (split_device_address(address)[1] - allocation.offset), allocation.size

    def _is_physical(self, address: int, allocation: Allocation) -> bool:
        blocks = self.virtual.blocks
        if not blocks:
            return False
        device, offset = split_device_address(address)
        return (device, address - (offset - allocation.offset)) in blocks

    def exportable(self, address: int) -> tuple[int, tuple[int, int]]:
        """aclrtIpcMemGetExportKey of memory at `address`: its device and (start, size) of
        the client's own allocation that holds it; 107000 for another address (imported
        memory too: it cannot be exported again)."""
        if not is_device_address(address):
            raise invalid(f"{address:#x} is not a device address")
        device, _ = split_device_address(address)
        if device >= len(self._devices):
            raise invalid(f"{address:#x} is not on any device")
        allocation = self.allocation_at(address)
        if allocation is None or allocation.owner is not self.owner:
            raise invalid(
                f"{address:#x} is not inside a device allocation of this process"
                + (
                    " (imported memory cannot be exported again)"
                    if self.imported_range(address)
                    else ""
                )
            )
        start = address - (split_device_address(address)[1] - allocation.offset)
        return device, (start, allocation.size)

    def imported_range(self, address: int) -> tuple[int, int] | None:
        """(start, size) of an IPC range this client imported that holds `address`."""
        for start, size, _ in self.imported.values():
            if start <= address < start + size:
                return start, size
        return None

    def owner_of(self, address: int) -> Any:
        """Another client owning the allocation at `address` (for error messages), if any."""
        allocation = self.allocation_at(address)
        return None if allocation is None or allocation.owner is self.owner else allocation.owner

    def device_range(self, address: int, count: int) -> Span:
        """[address, +count) of device memory, checked to lie in one allocation this client
        may use (its own, imported, or mapped); 107000 otherwise, 507053 in a reserved range
        where nothing is mapped."""
        found = self.own_allocation(address)
        if found is None:
            reservation = self.virtual.reservation_at(address)
            if reservation is not None:
                raise NpuError(
                    codes.ACL_ERROR_RT_DEVICE_MEM_ERROR,
                    f"memory fault: {address:#x} lies in the reserved range "
                    f"[{reservation.start:#x}, +{reservation.size}) where nothing is mapped",
                )
            raise invalid(f"{address:#x} is not inside a device allocation of this process")
        start, size = found
        if address + count > start + size:
            raise invalid(
                f"{count} bytes at {address:#x} run past the end of its allocation "
                f"[{start:#x}, +{size})"
            )
        return self.span(address)

    def span(self, address: int) -> Span:
        """Device memory at `address`, as units name it."""
        device, offset = split_device_address(address)
        return Span(self._devices[device].region.name, offset, device)

    def pool_of(self, address: int) -> dict | None:
        """The pool a block came from (for the snapshot), also while its FreeAsync waits."""
        pool = self.pool_blocks.get(address)
        if pool is not None:
            return pool.describe()
        for pool in list(self.pools):
            if address in pool.blocks:
                return {**pool.describe(), "free_pending": True}
        return None
