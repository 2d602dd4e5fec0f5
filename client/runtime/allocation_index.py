"""The device address ranges this process may use, looked up by any address inside them, so
that copies, launches, collectives and value calls are checked without a round trip.

Three kinds of range live here: allocations (aclrtMalloc, pool blocks, imported IPC memory,
the conditions of cond tasks: address -> (size, device)), reserved ranges with what is mapped
in them (virtual memory: client/runtime/virtual_memory.py), and the device pointers of
registered host memory (client/runtime/pinned_memory.py). The parts that make and free the
ranges keep the index up to date; every part that checks a pointer is given it. Lookups
take no lock (a range a call checks is its own to free); changes are made under `lock`,
which a part also holds when it checks its own tables and changes the index in one step.
"""

from __future__ import annotations

import bisect
import threading

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid


class AllocationIndex:
    """This process's device address ranges (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._starts: list[int] = []  # allocation starts, sorted
        self._allocations: dict[int, tuple[int, int]] = {}  # start -> (size, device)
        self._reserved_starts: list[int] = []
        self._reserved: dict[int, tuple[int, int]] = {}  # reserved range -> (size, device)
        self._mapping_starts: list[int] = []
        self._mappings: dict[int, tuple[int, int]] = {}  # mapped start -> (size, physical)
        self._alias_starts: list[int] = []
        self._aliases: dict[int, int] = {}  # device pointer of registered host memory -> size

    # ---- allocations ---------------------------------------------------------------------------
    def remember(self, address: int, size: int, device: int) -> None:
        """Add a block this process may use (its own, or imported) to the index."""
        with self.lock:
            if address not in self._allocations:
                bisect.insort(self._starts, address)
            self._allocations[address] = (size, device)

    def forget(self, address: int) -> None:
        """Drop a live allocation (the caller holds `lock`); by bisection, not list.remove:
        with thousands of blocks live, a free must not scan them all."""
        del self._allocations[address]
        starts = self._starts
        del starts[bisect.bisect_left(starts, address)]

    def holds(self, address: int) -> bool:
        """Is `address` the start of a live allocation of this process?"""
        return address in self._allocations

    def size_of(self, address: int) -> int:
        """The size of the allocation that starts at `address`."""
        return self._allocations[address][0]

    def allocation_at(self, address: int) -> tuple[int, int, int] | None:
        """(start, size, device) of the allocation holding `address`, if any."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0:
            start = self._starts[index]
            size, device = self._allocations[start]
            if address < start + size:
                return start, size, device
        return None

    def device_range(self, address: int, count: int) -> None:
        """Check [address, address+count) lies in one allocation of this process, or in its
        mapped memory (107000; 507053 where a reserved range has nothing mapped)."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0:
            start = self._starts[index]
            size = self._allocations[start][0]
            if address + count <= start + size:
                return
            if address < start + size:
                raise invalid(
                    f"{count} bytes at {address:#x} run past the end of the allocation "
                    f"[{start:#x}, +{size})"
                )
        if self.mapped_range(address, count) or self.registered_range(address, count):
            return
        raise invalid(f"{address:#x} is not inside a device allocation of this process")

    # ---- reserved ranges and what is mapped in them ----------------------------------------------
    def reserve(self, start: int, size: int, device: int) -> None:
        with self.lock:
            self._reserved[start] = (size, device)
            bisect.insort(self._reserved_starts, start)

    def release(self, start: int) -> None:
        with self.lock:
            del self._reserved[start]
            self._reserved_starts.remove(start)

    def is_reserved(self, start: int) -> bool:
        """Is `start` the start of a range this process reserved?"""
        return start in self._reserved

    def map(self, start: int, size: int, handle: int) -> None:
        """Physical memory `handle` is mapped at [start, +size)."""
        with self.lock:
            self._mappings[start] = (size, handle)
            bisect.insort(self._mapping_starts, start)

    def unmap(self, start: int) -> None:
        with self.lock:
            del self._mappings[start]
            self._mapping_starts.remove(start)

    def is_mapped(self, start: int) -> bool:
        """Is `start` the start of a mapping of this process?"""
        return start in self._mappings

    def mapping_at(self, address: int) -> tuple[int, int, int] | None:
        """(start, size, physical handle) of the mapping holding `address`, if any."""
        starts = self._mapping_starts
        if not starts:
            return None
        index = bisect.bisect_right(starts, address) - 1
        if index >= 0:
            start = starts[index]
            size, handle = self._mappings[start]
            if address < start + size:
                return start, size, handle
        return None

    def _reservation_at(self, address: int) -> int | None:
        index = bisect.bisect_right(self._reserved_starts, address) - 1
        if index >= 0:
            start = self._reserved_starts[index]
            if address < start + self._reserved[start][0]:
                return start
        return None

    def mapped_range(self, address: int, count: int) -> bool:
        """Does [address, +count) lie in mapped memory of this process (mappings side by
        side count as one buffer)? False outside reserved ranges; 507053 naming the range
        for an address of a reserved range where nothing is mapped; 107000 for a range that
        runs past the mapped part."""
        reservation = self._reservation_at(address) if self._reserved_starts else None
        if reservation is None:
            return False
        mapping = self.mapping_at(address)
        if mapping is None:
            raise NpuError(
                codes.ACL_ERROR_RT_DEVICE_MEM_ERROR,
                f"memory fault: {address:#x} lies in the reserved range "
                f"[{reservation:#x}, +{self._reserved[reservation][0]}) where nothing is mapped",
            )
        end = mapping[0] + mapping[1]
        while end < address + count and end in self._mappings:
            end += self._mappings[end][0]
        if address + count > end:
            raise invalid(
                f"{count} bytes at {address:#x} run past the end of the mapped memory "
                f"(it ends at {end:#x})"
            )
        return True

    # ---- device pointers of registered host memory -----------------------------------------------
    def add_registered(self, address: int, size: int) -> None:
        with self.lock:
            self._aliases[address] = size
            bisect.insort(self._alias_starts, address)

    def remove_registered(self, address: int) -> None:
        with self.lock:
            del self._aliases[address]
            del self._alias_starts[bisect.bisect_left(self._alias_starts, address)]

    def registered_range(self, address: int, count: int) -> bool:
        """Does device range [address, +count) lie in one registered host range?"""
        starts = self._alias_starts
        if not starts:
            return False
        index = bisect.bisect_right(starts, address) - 1
        if index < 0 or address >= starts[index] + self._aliases[starts[index]]:
            return False
        end = starts[index] + self._aliases[starts[index]]
        if address + count > end:
            raise invalid(
                f"{count} bytes at {address:#x} run past the end of registered host memory "
                f"(it ends at {end:#x})"
            )
        return True
