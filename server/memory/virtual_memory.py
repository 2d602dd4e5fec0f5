"""One client's virtual memory (aclrtReserveMemAddress, aclrtMallocPhysical, aclrtMapMem):
its reserved ranges, its physical blocks and what is mapped where (docs/device-memory.md).

Reserved ranges lie in the upper half of each device's address span, handed out by the
device's `ReservedSpace`; physical blocks are blocks of the device's allocator; a mapping
puts a whole physical block at a granularity-aligned address of a reserved range, in every
process that maps the device (`DeviceWithMemory.map_window`) and in the client's kernel processes
(its grant).
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.shm import window
from simnpu.shm.addresses import DEVICE_SPAN, MAX_MEMORY, device_address, split_device_address

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.server.memory.device_memory import DeviceWithMemory
    from simnpu.server.memory.quotas import Limits

GRANULARITY = 2 << 20
"""ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM and _RECOMMENDED of every physical memory attribute
but the 1 GiB huge pages'."""
GRANULARITY_1G = 1 << 30
HUGE_1G_ATTRS = (codes.ACL_HBM_MEM_HUGE1G, codes.ACL_MEM_HUGE1G, codes.ACL_MEM_P2P_HUGE1G)
_POLICY = codes.ACL_MEM_MALLOC_HUGE_FIRST


def granularity(mem_attr: int) -> int:
    """aclrtMemGetAllocationGranularity of device memory with attribute `mem_attr`."""
    return GRANULARITY_1G if mem_attr in HUGE_1G_ATTRS else GRANULARITY


class ReservedSpace:
    """The upper half of one device's address span: the reserved ranges of every client,
    so that no two overlap. Offsets are in the device's span."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._sizes: dict[int, int] = {}

    def reserve(self, size: int, alignment: int, at: int | None) -> int:
        """The offset of a new range of `size` bytes (a multiple of GRANULARITY), aligned to
        `alignment`, at offset `at` if given; 207001 when no room is left."""
        with self._lock:
            if at is not None:
                if not self._free(at, size):
                    raise invalid(
                        f"[{at:#x}, +{size}) of the device's reserved half is not free "
                        f"(it is {MAX_MEMORY:#x} to {DEVICE_SPAN:#x} of the device's span)"
                    )
                return self._add(at, size)
            candidate = MAX_MEMORY
            for start in self._starts:
                if candidate + size <= start:
                    break
                candidate = _align_up(start + self._sizes[start], alignment)
            if candidate + size > DEVICE_SPAN:
                raise NpuError(
                    codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                    f"cannot reserve {size} bytes of device address space: the device's "
                    f"{DEVICE_SPAN - MAX_MEMORY} bytes of reserved address space are taken",
                )
            return self._add(candidate, size)

    def release(self, offset: int) -> None:
        with self._lock:
            del self._sizes[offset]
            del self._starts[bisect.bisect_left(self._starts, offset)]

    def _free(self, at: int, size: int) -> bool:
        if at < MAX_MEMORY or at + size > DEVICE_SPAN or at % GRANULARITY:
            return False
        index = bisect.bisect_right(self._starts, at)
        if index and self._starts[index - 1] + self._sizes[self._starts[index - 1]] > at:
            return False
        return index == len(self._starts) or at + size <= self._starts[index]

    def _add(self, offset: int, size: int) -> int:
        bisect.insort(self._starts, offset)
        self._sizes[offset] = size
        return offset


@dataclass(eq=False)
class Physical:
    """A physical allocation: a block of `device`'s allocator, `size` bytes at `address`
    (never given out). Freed once the handle references and mappings of every process that
    holds it (its allocator and importers, server/memory/shareable_memory.py) are all gone."""

    device: int
    address: int
    size: int
    mem_attr: int
    owner: object  # the client that allocated it (its Owner): the block is its memory
    refs: int = 0  # handle references in every process (allocation, retains, imports)
    mapped: int = 0  # mappings of it in every process
    freed: bool = False  # back to the allocator

    def properties(self) -> dict:
        """aclrtPhysicalMemProp, C field names in snake case."""
        return {
            "handle_type": codes.ACL_MEM_HANDLE_TYPE_NONE,
            "allocation_type": codes.ACL_MEM_ALLOCATION_TYPE_PINNED,
            "mem_attr": self.mem_attr,
            "location": {"id": self.device, "type": codes.ACL_MEM_LOCATION_TYPE_DEVICE},
            "reserve": 0,
        }


@dataclass(eq=False)
class Reservation:
    """A reserved range [start, +size) of `device`, and the mappings in it by start."""

    device: int
    start: int
    size: int
    mappings: dict[int, Physical] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)  # of the mappings, sorted

    def mapping_at(self, address: int) -> int | None:
        """The start of the mapping holding `address`, if any."""
        index = bisect.bisect_right(self.starts, address) - 1
        if index >= 0:
            start = self.starts[index]
            if address < start + self.mappings[start].size:
                return start
        return None

    def run(self, start: int) -> tuple[int, int]:
        """(start, size) of the mappings side by side around the one at `start`: one buffer."""
        index = bisect.bisect_left(self.starts, start)
        first = last = index
        while first and self._touch(self.starts[first - 1], self.starts[first]):
            first -= 1
        while last + 1 < len(self.starts) and self._touch(self.starts[last], self.starts[last + 1]):
            last += 1
        end = self.starts[last] + self.mappings[self.starts[last]].size
        return self.starts[first], end - self.starts[first]

    def _touch(self, left: int, right: int) -> bool:
        return left + self.mappings[left].size == right


class VirtualMemory:
    """The reserved ranges, physical blocks and mappings of one client."""

    def __init__(self, owner: Owner, devices: list[DeviceWithMemory], limits: Limits):
        self.owner = owner
        self._devices = devices
        self._limits = limits
        self.reservations: dict[int, Reservation] = {}  # start -> range
        self._starts: list[int] = []  # of the reservations, sorted
        self.physical: dict[Physical, int] = {}  # its handle references of each
        self.blocks: set[tuple[int, int]] = set()  # (device, address) of what it holds or maps
        self._uses: dict[Physical, int] = {}  # its handle references and mappings of each

    # ---- reserved ranges -----------------------------------------------------------------------
    def reserve(self, device: DeviceWithMemory, size: int, alignment: int, expect: int) -> int:
        """aclrtReserveMemAddress: the start of a new range of `size` bytes (rounded up to the
        granularity) on `device`, at `expect` if not 0."""
        if size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot reserve {size} bytes")
        if alignment < 0 or alignment & (alignment - 1):
            raise invalid(f"alignment {alignment} is not a power of two")
        size = _align_up(size, GRANULARITY)
        at = None
        if expect:
            index, at = split_device_address(expect)
            if expect < device_address(0, 0) or index != device.index:
                raise invalid(f"{expect:#x} is not an address of device {device.index}")
        offset = device.reserved.reserve(size, max(alignment, GRANULARITY), at)
        start = device_address(device.index, offset)
        self.reservations[start] = Reservation(device.index, start, size)
        bisect.insort(self._starts, start)
        return start

    def release(self, address: int) -> None:
        """aclrtReleaseMemAddress: only a range without mappings."""
        reservation = self.reservations.get(address)
        if reservation is None:
            raise invalid(f"{address:#x} is not the start of a range this process reserved")
        if reservation.mappings:
            raise invalid(
                f"[{address:#x}, +{reservation.size}) still has {len(reservation.mappings)} "
                "mapping(s): unmap them first (aclrtUnmapMem)"
            )
        self._drop(reservation)

    def reservation_at(self, address: int) -> Reservation | None:
        """The reserved range holding `address`, if any."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0:
            reservation = self.reservations[self._starts[index]]
            if address < reservation.start + reservation.size:
                return reservation
        return None

    def mapped_run(self, address: int) -> tuple[int, int] | None:
        """(start, size) of the mapped memory around `address`, as one allocation: the
        mappings side by side that hold it."""
        reservation = self.reservation_at(address) if self._starts else None
        if reservation is None:
            return None
        start = reservation.mapping_at(address)
        return None if start is None else reservation.run(start)

    # ---- physical blocks -----------------------------------------------------------------------
    def malloc_physical(self, device: DeviceWithMemory, size: int, mem_attr: int) -> Physical:
        """aclrtMallocPhysical: a block of `size` bytes (rounded up to the granularity), its
        pages committed, under this client's limit."""
        size = _align_up(size, granularity(mem_attr))
        address = device.allocate(
            size, _POLICY, self.owner, self._limits.of(device.index), keep_reserve=True
        )
        physical = Physical(device.index, address, size, mem_attr, self.owner)
        self.hold(physical)
        return physical

    def hold(self, physical: Physical) -> None:
        """One more handle reference of `physical` in this client (aclrtMallocPhysical,
        aclrtMemRetainAllocationHandle, an import of a shareable handle)."""
        physical.refs += 1
        self.physical[physical] = self.physical.get(physical, 0) + 1
        self._use(physical, 1)

    def hold_import(self, physical: Physical, device: int, shareable: int) -> None:
        """aclrtMemImportFromShareableHandle of `shareable` for `device`: the exporter's
        physical memory, one more reference of this client; 207000 for another device's
        memory (not simulated), 107000 if this client imported it already."""
        if physical.device != device:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                f"the memory is on device {physical.device}: a handle for device {device} "
                "(another device's memory) is not simulated",
            )
        if physical in self.physical:
            raise invalid(f"{shareable:#x} was imported by this process already")
        self.hold(physical)

    def free_physical(self, physical: Physical) -> None:
        """aclrtFreePhysical (of any of this client's references): the block goes once
        every reference and mapping of every process is gone."""
        left = self.physical[physical] - 1
        if left:
            self.physical[physical] = left
        else:
            del self.physical[physical]
        physical.refs -= 1
        self._use(physical, -1)
        self._settle(physical)

    def retain(self, address: int) -> Physical:
        """aclrtMemRetainAllocationHandle: the block mapped at `address`, one more reference."""
        reservation = self.reservation_at(address)
        start = reservation.mapping_at(address) if reservation is not None else None
        if reservation is None or start is None:
            raise invalid(f"{address:#x} is not inside memory this process mapped")
        physical = reservation.mappings[start]
        self.hold(physical)
        return physical

    # ---- mappings -------------------------------------------------------------------------------
    def map(self, address: int, size: int, offset: int, physical: Physical) -> None:
        """aclrtMapMem: the whole of `physical` at `address` of a range of this client."""
        reservation = self.reservation_at(address)
        if reservation is None or address + size > reservation.start + reservation.size:
            raise invalid(
                f"[{address:#x}, +{size}) does not lie in one range this process reserved"
            )
        if offset:
            raise invalid(f"offset {offset} into the physical memory: ACL maps it whole (0)")
        if size != physical.size:
            raise invalid(
                f"size {size} is not the physical allocation's size {physical.size} "
                "(ACL maps it whole)"
            )
        step = granularity(physical.mem_attr)
        if address % step:
            raise invalid(f"{address:#x} is not aligned to the granularity {step}")
        if physical.device != reservation.device:
            raise NpuError(
                codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                f"mapping device {physical.device}'s memory into a range of device "
                f"{reservation.device} is not simulated",
            )
        index = bisect.bisect_left(reservation.starts, address + size) - 1
        if index >= 0:  # the last mapping starting before the end is the only one to check
            start = reservation.starts[index]
            if address < start + reservation.mappings[start].size:
                raise invalid(
                    f"[{address:#x}, +{size}) overlaps the mapping at {start:#x}: unmap it first"
                )
        reservation.mappings[address] = physical
        bisect.insort(reservation.starts, address)
        physical.mapped += 1
        self._devices[reservation.device].map_window(
            split_device_address(address)[1], size, split_device_address(physical.address)[1]
        )
        self._use(physical, 1)

    def unmap(self, address: int) -> None:
        """aclrtUnmapMem of the mapping that starts at `address`."""
        reservation = self.reservation_at(address)
        if reservation is None or address not in reservation.mappings:
            raise invalid(f"{address:#x} is not the start of memory this process mapped")
        self._unmap(reservation, address)

    def _unmap(self, reservation: Reservation, address: int) -> None:
        physical = reservation.mappings.pop(address)
        del reservation.starts[bisect.bisect_left(reservation.starts, address)]
        physical.mapped -= 1
        self._use(physical, -1)
        self._settle(physical)

    # ---- the client's memory ---------------------------------------------------------------------
    def describe(self, address: int) -> dict | None:
        """For the snapshot: the physical block at `address` -- its handle references and
        the addresses it is mapped at -- or None if it is not one."""
        if not self.blocks or (split_device_address(address)[0], address) not in self.blocks:
            return None
        physical = next((p for p in self._held() if p.address == address), None)
        if physical is None:
            return None
        mapped_at = sorted(
            start
            for reservation in list(self.reservations.values())
            for start, mapped in list(reservation.mappings.items())
            if mapped is physical
        )
        return {"handle_references": self.physical.get(physical, 0), "mapped_at": mapped_at}

    def grant(self) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int, int, str]]]:
        """For its kernel processes: the blocks (device, offset, size) and the mappings
        (device, reserved offset, size, block offset, window.OWN: the device's memory)."""
        blocks = [(p.device, split_device_address(p.address)[1], p.size) for p in self._held()]
        mappings = [
            (
                r.device,
                split_device_address(start)[1],
                p.size,
                split_device_address(p.address)[1],
                window.OWN,
            )
            for r in list(self.reservations.values())
            for start, p in list(r.mappings.items())
        ]
        return blocks, mappings

    def release_all(self) -> None:
        """The session ends: unmap everything, free its blocks, release its ranges."""
        for reservation in list(self.reservations.values()):
            for address in list(reservation.mappings):
                self._unmap(reservation, address)
            self._drop(reservation)
        for physical, references in list(self.physical.items()):
            physical.refs -= references
            self._use(physical, -references)
            self._settle(physical)
        self.physical.clear()

    def _held(self) -> set[Physical]:
        """The physical blocks this client holds a handle of or maps."""
        return set(self._uses)

    def _use(self, physical: Physical, change: int) -> None:
        """`change` more (or fewer) handle references or mappings of `physical` in this
        client: its blocks and its kernel processes' grant change with them. Constant time,
        however many blocks it holds (an expandable segment maps one chunk after another)."""
        uses = self._uses.get(physical, 0) + change
        if uses:
            self._uses[physical] = uses
            self.blocks.add((physical.device, physical.address))
        else:
            del self._uses[physical]
            self.blocks.discard((physical.device, physical.address))
        self.owner.memory_generation += 1

    def _settle(self, physical: Physical) -> None:
        """Free `physical` once no process holds or maps it (whichever client lets go last:
        the block stays its allocator's in the statistics until then)."""
        if physical.refs <= 0 and not physical.mapped and not physical.freed:
            physical.freed = True
            self._devices[physical.device].free(physical.address)

    def _drop(self, reservation: Reservation) -> None:
        del self.reservations[reservation.start]
        del self._starts[bisect.bisect_left(self._starts, reservation.start)]
        device = self._devices[reservation.device]
        device.reserved.release(split_device_address(reservation.start)[1])


def _align_up(value: int, step: int) -> int:
    return (value + step - 1) // step * step
