"""Host memory as the client sees it: pinned segments, the staging area, pointer classes.

Pinned memory (aclrtMallocHost) is a shared segment created by the daemon and mapped
here, so its host pointer is a real address of this process and copy engines read and
write it directly. When the daemon's shared memory is out of reach (another container,
another host) pinned memory is ordinary process memory and copies carry their bytes in
the gRPC stream instead.
"""

from __future__ import annotations

import bisect
import ctypes

from simnpu.shm.addresses import is_device_address
from simnpu.shm.region import Region

DEVICE = "device"
PINNED = "pinned"
PAGEABLE = "pageable"


class PinnedBlock:
    __slots__ = ("address", "buffer", "handle", "region", "size")

    def __init__(self, handle, address, size, region=None, buffer=None):
        self.handle = handle
        self.address = address
        self.size = size
        self.region = region  # shared segment (shared-memory mode)
        self.buffer = buffer  # ctypes buffer (in-stream mode)


class HostMemory:
    """Pinned blocks of this process, looked up by any address inside them."""

    def __init__(self):
        self._starts: list[int] = []
        self._blocks: dict[int, PinnedBlock] = {}

    def add_shared(self, handle: int, size: int, name: str) -> PinnedBlock:
        region = Region.attach(name, populate=True)  # page-locked memory is resident
        return self._add(PinnedBlock(handle, region.address(), size, region=region))

    def add_private(self, handle: int, size: int) -> PinnedBlock:
        buffer = (ctypes.c_char * size)()
        return self._add(PinnedBlock(handle, ctypes.addressof(buffer), size, buffer=buffer))

    def _add(self, block: PinnedBlock) -> PinnedBlock:
        bisect.insort(self._starts, block.address)
        self._blocks[block.address] = block
        return block

    def remove(self, address: int) -> PinnedBlock | None:
        block = self._blocks.pop(address, None)
        if block is not None:
            self._starts.remove(address)
        return block

    def find(self, address: int) -> PinnedBlock | None:
        """The pinned block containing `address`, if any."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        block = self._blocks[self._starts[index]]
        return block if address < block.address + block.size else None

    def classify(self, address: int) -> str:
        if is_device_address(address):
            return DEVICE
        return PINNED if self.find(address) is not None else PAGEABLE

    def blocks(self) -> list[PinnedBlock]:
        return list(self._blocks.values())
