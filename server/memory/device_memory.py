"""One simulated device with its memory: the region and allocator, the host's limit on
committed pages, the reserved address ranges and what is mapped there.

Its memory is committed as it is allocated and given back as large free blocks form
(docs/device-memory.md). The device as the scheduler sees it -- its units and ready queues --
is the core's (server/core/device.py), which this extends.
"""

from __future__ import annotations

import logging
import mmap
import threading
from collections.abc import Callable
from typing import Protocol

from simnpu.proto.errors import NpuMemoryError
from simnpu.server.core.device import Device
from simnpu.server.core.owner import Owner
from simnpu.server.core.rate_limits import log_about
from simnpu.server.core.reserves import Reserves
from simnpu.server.core.untrusted import escaped
from simnpu.server.memory.device_backing import BackingLog, DeviceBacking
from simnpu.server.memory.host_memory import HostMemory, committed_failure
from simnpu.server.memory.virtual_memory import ReservedSpace
from simnpu.server.memory.window_table import WindowTable
from simnpu.shm import window
from simnpu.shm.addresses import device_address, split_device_address
from simnpu.shm.allocator import Allocation, DeviceAllocator
from simnpu.shm.region import Region, segment_name

log = logging.getLogger("simnpu.memory")

DECOMMIT_MIN = 2 << 20
"""A free that leaves a free block of at least this many bytes gives the block's pages back."""


class BlockMappers(Protocol):
    """The processes that map clients' device memory to run their own kernels, as a free
    sees them (server/units/kernel_processes.py's KernelProcesses)."""

    @property
    def lock(self) -> threading.RLock:
        """Orders every change of which process maps what against frees (taken first)."""

    @property
    def mapped(self) -> bool:
        """Does any of them map device memory now?"""

    def freeing(self, device: int, offset: int, length: int, release: Callable[[], object]) -> bool:
        """`[offset, +length)` of `device` is to be freed: end the idle processes that map
        it. True: free it now; False: `release` frees it once the busy ones have ended."""


class DeviceWithMemory(Device):
    """Device `index` and its memory (owned here); its units are driven by the scheduler."""

    def __init__(
        self,
        index: int,
        memory_bytes: int,
        ai_cores: int,
        copy_engines: int,
        first_core_id: int,
        host: HostMemory,
        windows: WindowTable | None = None,
        reserves: Reserves | None = None,
        backing: BackingLog | None = None,
    ):
        region = Region.create(segment_name(f"dev{index}"), memory_bytes, device=True)
        super().__init__(index, region, ai_cores, copy_engines, first_core_id)
        # the file of each page run: a client's blocks live in a file of its own
        self.backing = DeviceBacking(
            index, region, backing if backing is not None else BackingLog()
        )
        self._gone: set[object] = set()  # ended owners that still hold blocks (IPC imports)
        self.reserved = ReservedSpace()  # aclrtReserveMemAddress's ranges (docs/device-memory.md)
        self.windows = windows if windows is not None else WindowTable()
        self._mapped: dict[int, tuple[int, int, str]] = {}  # reserved offset -> (length,
        # source offset, source): the last entry mapped at each offset, unmapped or not
        self.host = host  # what the host can still back with pages
        self.allocator = DeviceAllocator(memory_bytes, align=mmap.PAGESIZE)  # blocks own pages
        self.lock = threading.Lock()  # guards the allocator: sessions allocate concurrently
        self.kernels: BlockMappers | None = None  # the daemon's kernel processes, once they run
        # the last of its memory, kept for processes that start (server/core/reserves.py)
        self.reserve = (reserves or Reserves()).memory(index, self.allocator.capacity)

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    def allocate(
        self,
        size: int,
        policy: int,
        owner: object,
        limit: int | None = None,
        keep_reserve: bool = False,
    ) -> int:
        """aclrtMalloc on this device: the device address of a new allocation, its pages
        committed. `limit` caps what `owner` may have reserved in all (its memory quota);
        `keep_reserve`: a client's block, which may not take the device's reserve from
        other processes (server/core/reserves.py). Blocks while the pages are committed
        (outside the device's lock)."""
        with self.lock:
            try:
                allocator = self.allocator
                ceiling = None
                if keep_reserve and self.reserve.kept:
                    ceiling = self.reserve.ceiling(
                        allocator.used_by(owner), allocator.capacity - allocator.free_bytes
                    )
                if ceiling is None or (limit is not None and limit <= ceiling):
                    allocation = allocator.allocate(size, policy, owner, limit)
                elif size > allocator.largest_free_block:  # it fits nowhere: as if no reserve,
                    allocation = allocator.allocate(size, policy, owner, limit)  # for its report
                else:
                    allocation = self._allocate_outside_reserve(size, policy, owner, ceiling)
                try:
                    self.host.check(allocation.reserved)
                except NpuMemoryError:
                    self._give_back(allocation.offset, withdraw=True)
                    raise
                try:
                    self.backing.assign(allocation.offset, allocation.reserved, owner)
                except OSError as error:  # no file for its memory: the host is out of them
                    self._give_back(allocation.offset, withdraw=True)
                    raise committed_failure(allocation.reserved, error) from None
            except NpuMemoryError as error:  # who holds the memory: told the daemon's owner only
                log_about(
                    owner,
                    log,
                    logging.INFO,
                    "%r: %s; top users: %s",
                    owner,
                    escaped(error.message),
                    escaped(self.allocator.top_users()),
                )
                raise
        try:  # the block is nobody else's yet, and no decommit reaches a live block
            self.region.commit(allocation.offset, allocation.reserved)
        except OSError as error:  # the host ran short since the check
            with self.lock:
                self._give_back(allocation.offset, withdraw=True)
            failure = committed_failure(allocation.reserved, error)
            log_about(owner, log, logging.INFO, "%r: %s", owner, escaped(failure.message))
            raise failure from None
        return device_address(self.index, allocation.offset)

    def _allocate_outside_reserve(
        self, size: int, policy: int, owner: object, ceiling: int
    ) -> Allocation:
        """allocator.allocate with what the reserve leaves `owner` as its limit; refused
        with 207001 and the reserve's reason (caller holds the lock)."""
        try:
            return self.allocator.allocate(size, policy, owner, ceiling)
        except NpuMemoryError as error:
            allocator = self.allocator
            held, in_use = allocator.used_by(owner), allocator.capacity - allocator.free_bytes
            why = self.reserve.refuses(held, in_use, size)
            if why is None:
                raise
            raise NpuMemoryError(f"cannot allocate {size} bytes: {why}") from error

    def free(self, address: int) -> Allocation:
        """aclrtFree on this device (and every other way a block goes back). Kernel
        processes that map the block end first: no page reaches another client while a
        process maps it. Blocks until they are gone."""
        _, offset = split_device_address(address)
        kernels = self.kernels
        if kernels is None:
            with self.lock:
                return self._give_back(offset)
        with kernels.lock:
            if kernels.mapped:
                with self.lock:
                    block = self.allocator.lookup(offset)
                if (
                    block is not None
                    and block.offset == offset
                    and not kernels.freeing(
                        self.index, offset, block.reserved, lambda: self._release(offset)
                    )
                ):
                    _changed(block.owner)
                    return block  # released once the kernels that map it have ended
            return self._release(offset)

    def _release(self, offset: int) -> Allocation:
        with self.lock:
            allocation = self._give_back(offset)
        _changed(allocation.owner)
        return allocation

    def _give_back(self, offset: int, withdraw: bool = False) -> Allocation:
        """Free the block at `offset` in the allocator (`withdraw`: an allocation that failed,
        see DeviceAllocator.withdraw) and, if that leaves a free block of DECOMMIT_MIN
        bytes or more, give the whole free block's pages back (holes already punched cost
        next to nothing). Under the lock: no allocation lands there meanwhile."""
        allocator = self.allocator
        allocation = allocator.withdraw(offset) if withdraw else allocator.free(offset)
        start, size = self.allocator.freed_block
        if size >= DECOMMIT_MIN:
            self.region.decommit(start, size)  # (the host's estimate catches up by itself)
        self.backing.release(allocation.offset)  # its own file, if it was exported
        owner = allocation.owner
        if owner in self._gone and not allocator.used_by(owner):
            self._gone.discard(owner)
            self.backing.owner_gone(owner)
        return allocation

    def owner_gone(self, owner: object) -> None:
        """`owner`'s session ended: its file of this device's memory goes once it holds no
        block here (server/memory/device_backing.py). Never blocks on other clients."""
        with self.lock:
            if self.allocator.used_by(owner):
                self._gone.add(owner)
            else:
                self.backing.owner_gone(owner)

    def unshared(self, address: int, length: int) -> bool:
        """Whether exporting `[address, +length)` (inside a live block) moves pages into the
        block's own file (`share`): False once its pages are there."""
        _, offset = split_device_address(address)
        with self.lock:
            block = self.allocator.lookup(offset)
            if block is None:
                return False
            start, end = _pages(offset, length)
            return self.backing.unshared(block.offset, start, end - start)

    def share(self, address: int, length: int, owner: Owner) -> None:
        """`owner` exports `[address, +length)` of its block (aclrtIpcMemGetExportKey,
        aclrtMemExportToShareableHandle): the pages move into the block's own file, so
        that its importers map nothing else of `owner` (server/memory/device_backing.py);
        what maps them there (VMM mappings included) follows. Nothing of `owner` may run
        meanwhile (Scheduler.quiet), so its block stays. Blocks while the pages' bytes are
        copied, holding no lock that other clients need."""
        _, offset = split_device_address(address)
        with self.lock:
            block = self.allocator.lookup(offset)
        if block is None or block.owner is not owner:
            return  # not its memory (any more): nothing to share
        start, end = _pages(offset, length)
        was = self.backing.source_of(owner)
        changes = self.backing.share(block.offset, start, end - start, owner)
        if not changes:
            return
        moved = [(change.offset, change.offset + change.length) for change in changes]
        with self.lock:
            stale = [
                o
                for o, (n, b, file) in self._mapped.items()
                if file == was and any(b < stop and first < b + n for first, stop in moved)
            ]
            for o in stale:  # VMM mappings of the pages: from their new file
                n, b, _ = self._mapped.pop(o)
                for piece, size, file in self.backing.sources(b, n):
                    self._mapped[o + piece - b] = (size, piece, file)
            if stale:
                mappings = {(o, n, b, s) for o, (n, b, s) in self._mapped.items()}
                self.region.map_reserved(mappings)
                self.windows.update(self.index, mappings)
        _changed(owner)

    def map_window(self, offset: int, length: int, block: int, source: str = window.OWN) -> None:
        """aclrtMapMem: the block at `block` (of `source`: this device's segment, or a host
        segment by name for registered host memory, or window.RETIRED) is at reserved offset
        `offset` for every process that maps this device: the daemon now, the workers with
        their next batch. What it replaces there goes; an unmap changes nothing here: until
        something else is mapped there, the old pages stay, so work that outlives an unmap
        touches them as work that outlives a free does (docs/device-memory.md), never a page
        that is not mapped."""
        with self.lock:
            end = offset + length
            self._mapped = {
                o: entry for o, entry in self._mapped.items() if o + entry[0] <= offset or end <= o
            }
            if source == window.OWN:  # from the files of the block's pages
                for start, size, file in self.backing.sources(block, length):
                    self._mapped[offset + start - block] = (size, start, file)
            else:
                self._mapped[offset] = (length, block, source)
            mappings = {(o, n, b, s) for o, (n, b, s) in self._mapped.items()}
            self.region.map_reserved(mappings)
            self.windows.update(self.index, mappings)

    def used_by(self, owner: object) -> int:
        """Bytes `owner`'s live blocks reserve on this device."""
        with self.lock:
            return self.allocator.used_by(owner)

    def lookup(self, address: int) -> Allocation | None:
        """The live allocation containing `address`, if any."""
        _, offset = split_device_address(address)
        with self.lock:
            return self.allocator.lookup(offset)

    def close(self) -> None:
        self.backing.close()
        self.region.close()


def _pages(offset: int, length: int) -> tuple[int, int]:
    """[start, end) of the whole pages that hold `[offset, +length)`."""
    page = mmap.PAGESIZE
    return offset // page * page, -(-(offset + length) // page) * page


def _changed(owner: object) -> None:
    """`owner`'s device memory changed (its kernel processes' grant with it)."""
    if isinstance(owner, Owner):
        owner.memory_generation += 1
