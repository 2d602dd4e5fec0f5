"""One client's registered host memory (aclrtHostRegister(V2), aclrtMemAllocManaged): device
aliases of its pinned segments (docs/device-memory.md, "Host memory kernels can reach").

A registration maps the pages of a pinned segment that hold `[offset, +size)` at a range of
the device's reserved half, in every window (`DeviceWithMemory.map_window` with the segment as the
source) and in the client's kernel processes (its grant). Unregistering retires the range:
every window maps fresh private pages there, so work that outlives it touches nothing
shared.
"""

from __future__ import annotations

import bisect
import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.server.memory.virtual_memory import GRANULARITY
from simnpu.shm import window
from simnpu.shm.addresses import device_address

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.server.memory.device_memory import DeviceWithMemory
    from simnpu.server.memory.pinned_memory import Pinned

PAGE = mmap.PAGESIZE


@dataclass(eq=False)
class Registration:
    """`size` bytes at `offset` of the pinned segment `pinned`, reachable at `address` (a
    device address of `device`); `host` is the client's address of the same bytes."""

    device: int
    pinned: Pinned
    offset: int
    size: int
    host: int
    managed: bool
    alias: int  # offset of the alias range in the device's span
    alias_size: int  # bytes of reserved address space it takes
    length: int  # bytes of the segment mapped there (whole pages)

    @property
    def address(self) -> int:
        """The device pointer of the registered range's first byte."""
        return device_address(self.device, self.alias) + self.offset % PAGE


class RegisteredMemory:
    """The registered host ranges of one client, by device pointer."""

    def __init__(self, owner: Owner, devices: list[DeviceWithMemory]):
        self.owner = owner
        self._devices = devices
        self.by_address: dict[int, Registration] = {}
        self._starts: list[int] = []  # device pointers, sorted
        self._managed: dict[int, Registration] = {}  # host address -> managed registration
        self._managed_starts: list[int] = []

    def register(
        self,
        device: DeviceWithMemory,
        pinned: Pinned,
        offset: int,
        size: int,
        host: int,
        managed: bool,
    ) -> Registration:
        """Map `[offset, +size)` of `pinned` at a new device address range of `device`;
        507910 if part of it is registered already."""
        if size <= 0 or offset < 0 or offset + size > pinned.size:
            raise invalid(
                f"[{offset}, +{size}) is not inside the {pinned.size} bytes of the pinned memory"
            )
        for other in self.by_address.values():
            if (
                other.pinned is pinned
                and other.offset < offset + size
                and offset < other.offset + other.size
            ):
                raise NpuError(
                    codes.ACL_ERROR_RT_HOST_MEMORY_ALREADY_REGISTERED,
                    f"host memory [{host:#x}, +{size}) overlaps a range registered already "
                    f"([{other.host:#x}, +{other.size}))",
                )
        first = offset & -PAGE
        length = ((offset + size + PAGE - 1) & -PAGE) - first
        alias_size = (length + GRANULARITY - 1) // GRANULARITY * GRANULARITY
        alias = device.reserved.reserve(alias_size, GRANULARITY, None)
        registration = Registration(
            device.index, pinned, offset, size, host, managed, alias, alias_size, length
        )
        device.map_window(alias, length, first, pinned.region.name)
        self.by_address[registration.address] = registration
        bisect.insort(self._starts, registration.address)
        if managed:
            self._managed[host] = registration
            bisect.insort(self._managed_starts, host)
        self.owner.memory_generation += 1
        return registration

    def unregister(self, address: int) -> Registration:
        """Retire the registration whose device pointer is `address`; 507911 if none is."""
        registration = self.by_address.pop(address, None)
        if registration is None:
            raise NpuError(
                codes.ACL_ERROR_RT_HOST_MEMORY_NOT_REGISTERED,
                f"{address:#x} is not the device pointer of host memory this process registered",
            )
        del self._starts[bisect.bisect_left(self._starts, address)]
        if registration.managed:
            del self._managed[registration.host]
            del self._managed_starts[bisect.bisect_left(self._managed_starts, registration.host)]
        device = self._devices[registration.device]
        device.map_window(registration.alias, registration.length, 0, window.RETIRED)
        device.reserved.release(registration.alias)
        self.owner.memory_generation += 1
        return registration

    def of_segment(self, pinned: Pinned) -> list[Registration]:
        """The registrations of the pinned memory `pinned`."""
        return [r for r in self.by_address.values() if r.pinned is pinned]

    def run(self, address: int) -> tuple[int, int] | None:
        """(device pointer, size) of the registered range holding device address `address`."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0:
            registration = self.by_address[self._starts[index]]
            if address < registration.address + registration.size:
                return registration.address, registration.size
        return None

    def translate(self, value: int) -> int:
        """A kernel's pointer argument: a host address of managed memory becomes the same
        byte's device address; anything else is unchanged."""
        if not self._managed_starts:
            return value
        index = bisect.bisect_right(self._managed_starts, value) - 1
        if index >= 0:
            registration = self._managed[self._managed_starts[index]]
            if value < registration.host + registration.size:
                return registration.address + value - registration.host
        return value

    def grant(self) -> list[tuple[int, int, int, int, str]]:
        """For its kernel processes: (device, alias offset, length, segment offset, segment)."""
        return [
            (r.device, r.alias, r.length, r.offset & -PAGE, r.pinned.region.name)
            for r in list(self.by_address.values())
        ]

    def release_all(self) -> None:
        """The session ends: retire every registration."""
        for address in list(self.by_address):
            self.unregister(address)
