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


class SortedRanges:
    """Ranges looked up by any address inside them: their starts, sorted, and a value per
    start whose first item is the range's size. Changes are the caller's to serialize."""

    __slots__ = ("starts", "values")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.values: dict[int, tuple] = {}  # start -> (size, ...)

    def add(self, start: int, value: tuple) -> None:
        if start not in self.values:
            bisect.insort(self.starts, start)
        self.values[start] = value

    def remove(self, start: int) -> None:
        """By bisection, not list.remove: with thousands of ranges, a free must not scan
        them all."""
        del self.values[start]
        del self.starts[bisect.bisect_left(self.starts, start)]

    def holding(self, address: int) -> int | None:
        """The start of the range holding `address`, if any."""
        index = bisect.bisect_right(self.starts, address) - 1
        if index >= 0:
            start = self.starts[index]
            if address < start + self.values[start][0]:
                return start
        return None


class AllocationIndex:
    """This process's device address ranges (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._allocations = SortedRanges()  # start -> (size, device)
        self._reserved = SortedRanges()  # reserved range -> (size, device)
        self._mappings = SortedRanges()  # mapped start -> (size, physical handle)
        self._registered = SortedRanges()  # device pointer of registered host memory -> (size,)

    # ---- allocations ---------------------------------------------------------------------------
    def remember(self, address: int, size: int, device: int) -> None:
        """Add a block this process may use (its own, or imported) to the index."""
        with self.lock:
            self._allocations.add(address, (size, device))

    def forget(self, address: int) -> None:
        """Drop a live allocation (the caller holds `lock`)."""
        self._allocations.remove(address)

    def holds(self, address: int) -> bool:
        """Is `address` the start of a live allocation of this process?"""
        return address in self._allocations.values

    def size_of(self, address: int) -> int:
        """The size of the allocation that starts at `address`."""
        return self._allocations.values[address][0]

    def allocation_at(self, address: int) -> tuple[int, int, int] | None:
        """(start, size, device) of the allocation holding `address`, if any."""
        start = self._allocations.holding(address)
        return None if start is None else (start, *self._allocations.values[start])

    def device_range(self, address: int, count: int) -> None:
        """Check [address, address+count) lies in one allocation of this process, or in its
        mapped memory (107000; 507053 where a reserved range has nothing mapped)."""
        allocations = self._allocations
        starts = allocations.starts
        index = bisect.bisect_right(starts, address) - 1
        if index >= 0:
            start = starts[index]
            size = allocations.values[start][0]
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
            self._reserved.add(start, (size, device))

    def release(self, start: int) -> None:
        with self.lock:
            self._reserved.remove(start)

    def is_reserved(self, start: int) -> bool:
        """Is `start` the start of a range this process reserved?"""
        return start in self._reserved.values

    def map(self, start: int, size: int, handle: int) -> None:
        """Physical memory `handle` is mapped at [start, +size)."""
        with self.lock:
            self._mappings.add(start, (size, handle))

    def unmap(self, start: int) -> None:
        with self.lock:
            self._mappings.remove(start)

    def is_mapped(self, start: int) -> bool:
        """Is `start` the start of a mapping of this process?"""
        return start in self._mappings.values

    def mapping_at(self, address: int) -> tuple[int, int, int] | None:
        """(start, size, physical handle) of the mapping holding `address`, if any."""
        if not self._mappings.starts:
            return None
        start = self._mappings.holding(address)
        return None if start is None else (start, *self._mappings.values[start])

    def mapped_range(self, address: int, count: int) -> bool:
        """Does [address, +count) lie in mapped memory of this process (mappings side by
        side count as one buffer)? False outside reserved ranges; 507053 naming the range
        for an address of a reserved range where nothing is mapped; 107000 for a range that
        runs past the mapped part."""
        reserved = self._reserved
        reservation = reserved.holding(address) if reserved.starts else None
        if reservation is None:
            return False
        mapping = self.mapping_at(address)
        if mapping is None:
            raise NpuError(
                codes.ACL_ERROR_RT_DEVICE_MEM_ERROR,
                f"memory fault: {address:#x} lies in the reserved range "
                f"[{reservation:#x}, +{reserved.values[reservation][0]}) where nothing is mapped",
            )
        mappings = self._mappings.values
        end = mapping[0] + mapping[1]
        while end < address + count and end in mappings:
            end += mappings[end][0]
        if address + count > end:
            raise invalid(
                f"{count} bytes at {address:#x} run past the end of the mapped memory "
                f"(it ends at {end:#x})"
            )
        return True

    # ---- device pointers of registered host memory -----------------------------------------------
    def add_registered(self, address: int, size: int) -> None:
        with self.lock:
            self._registered.add(address, (size,))

    def remove_registered(self, address: int) -> None:
        with self.lock:
            self._registered.remove(address)

    def registered_range(self, address: int, count: int) -> bool:
        """Does device range [address, +count) lie in one registered host range?"""
        registered = self._registered
        if not registered.starts:
            return False
        start = registered.holding(address)
        if start is None:
            return False
        end = start + registered.values[start][0]
        if address + count > end:
            raise invalid(
                f"{count} bytes at {address:#x} run past the end of registered host memory "
                f"(it ends at {end:#x})"
            )
        return True
