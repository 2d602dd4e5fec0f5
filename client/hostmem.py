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
import functools
import mmap

from simnpu.proto.errors import NpuError, invalid
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


# ---- pageable memory ---------------------------------------------------------------------------
_PAGE = mmap.PAGESIZE
_MADV_POPULATE_READ = 22  # Linux 5.14
_MADV_POPULATE_WRITE = 23
_MS_ASYNC = 1
_libc = ctypes.CDLL(None, use_errno=True)
_madvise = _libc.madvise
_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_madvise.restype = ctypes.c_int
_msync = _libc.msync
_msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_msync.restype = ctypes.c_int
_PROBE = ctypes.create_string_buffer(1)  # a page this process surely reads


@functools.cache
def _can_populate() -> bool:
    """Whether this kernel knows MADV_POPULATE_READ/WRITE (asked once, of a page of ours)."""
    return _madvise(ctypes.addressof(_PROBE) & -_PAGE, _PAGE, _MADV_POPULATE_READ) == 0


def check_pageable(address: int, count: int, write: bool, name: str) -> None:
    """Raise 107000 (naming `name` and `address`) unless this process may read -- or write,
    when `write` -- the `count` bytes of host memory at `address`. Never waits for the
    device; it may fault pages in, as the copy that follows would.

    One system call: madvise(MADV_POPULATE_READ or _WRITE) faults the pages in as the copy
    is about to (ENOMEM: part of the range is not mapped; EINVAL: mapped without that
    permission -- read-only, PROT_NONE, or an I/O mapping; EFAULT: past the end of a mapped
    file). It walks the range's page tables: about 40 µs per MiB of resident 4 KiB pages on
    the development machine (less on huge pages), against a copy that moves every byte.
    Before Linux 5.14, msync(MS_ASYNC) proves only that the range is mapped: a read-only or
    PROT_NONE range still faults there. Neither guards against another thread unmapping the
    range afterwards.
    """
    start = address & -_PAGE
    length = address + count - start
    if address + count > DEVICE_BASE:
        failed = errno.ENOMEM
    elif _can_populate():
        advice = _MADV_POPULATE_WRITE if write else _MADV_POPULATE_READ
        if _madvise(start, length, advice) == 0:
            return
        failed = ctypes.get_errno()
    elif _msync(start, length, _MS_ASYNC) == 0:
        return
    else:
        failed = ctypes.get_errno()
    raise _unusable(address, count, write, name, failed)


def _unusable(address: int, count: int, write: bool, name: str, failed: int) -> NpuError:
    if failed == errno.ENOMEM:
        why = "are not mapped in this process"
    else:
        why = (
            f"are mapped, but this process may not {'write' if write else 'read'} them "
            "(a read-only or protected mapping, or past the end of a mapped file)"
        )
    return invalid(f"{name} {address:#x}: the {count} bytes of host memory there {why}")
