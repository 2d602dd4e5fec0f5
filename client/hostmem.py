"""Host memory as the client sees it: pinned segments, the staging area, pointer classes.

Pinned memory (aclrtMallocHost) is a shared segment created by the daemon and mapped
here, so its host pointer is a real address of this process and copy engines read and
write it directly. When the daemon's shared memory is out of reach (another container,
another host) pinned memory is ordinary process memory and copies carry their bytes in
the gRPC stream instead.

Pageable memory is whatever else the caller points at: `check_pageable` makes sure this
process can touch it before a copy or memset does, so that a bad host pointer is 107000
rather than a segmentation fault.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import mmap

from simnpu.proto.errors import invalid
from simnpu.shm.addresses import DEVICE_BASE, is_device_address
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


class PinnedBlocks:
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


# ---- pageable memory ---------------------------------------------------------------------------
_PAGE = mmap.PAGESIZE
_MS_ASYNC = 1
_msync = ctypes.CDLL(None, use_errno=True).msync
_msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_msync.restype = ctypes.c_int


def check_pageable(address: int, count: int, write: bool, name: str) -> None:
    """Raise 107000 (naming `name` and `address`) unless the `count` bytes of host memory at
    `address` are mapped in this process. Never waits. (`write`, the range is a
    destination, is not told apart: see below.)

    One system call, msync(MS_ASYNC), which fails with ENOMEM when part of the range is not
    mapped; it looks at the process's mappings, not at each page: about 1.5 µs whatever
    the size. It does not see protections: a mapped read-only or PROT_NONE range still
    faults when copied, as on hardware (checking them page by page, with
    madvise(MADV_POPULATE_*), cost as much as the copy of a 1 MiB array of 4 KiB pages).
    Nothing guards against another thread unmapping the range afterwards.
    """
    start = address & -_PAGE
    if address + count > DEVICE_BASE:
        failed = errno.ENOMEM
    elif _msync(start, address + count - start, _MS_ASYNC) == 0:
        return
    else:
        failed = ctypes.get_errno()
    why = (
        "are not mapped in this process"
        if failed == errno.ENOMEM
        else f"cannot be checked ({errno.errorcode.get(failed, failed)})"
    )
    raise invalid(f"{name} {address:#x}: the {count} bytes of host memory there {why}")
