"""Windows of device address space in this process (docs/device-memory.md).

A device's window is its whole address span (`DEVICE_SPAN`) reserved PROT_NONE, with its
segment mapped shared at the start; physical blocks mapped at reserved device addresses
(aclrtMapMem) are the segment's pages mapped again, MAP_FIXED, at those offsets. A device
address is then an offset into the window, for reserved ranges as for aclrtMalloc memory.
Reserving costs no memory and no commit charge (MAP_NORESERVE, PROT_NONE).
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterable

import posix_ipc

from simnpu.shm.addresses import DEVICE_SPAN

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_MAP_FAILED = ctypes.c_void_p(-1).value
_PROT_NONE = 0
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FIXED = 0x10
_MAP_NORESERVE = 0x4000
_RESERVE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE

Mapping = tuple[int, int, int]
"""(offset in the window, length, offset in the segment): whole pages."""
Entry = tuple[int, int, int, str]
"""A mapping of a window's reserved half: (offset in the window, length, offset in the
source, source), whole pages. The source is a segment by name (the file of a client's
device memory, registered pinned memory), or RETIRED."""
OWN = ""
"""The source of a physical block as the daemon's memory calls name it: the device's own
memory, which the device translates into the files that back the block
(server/memory/device_backing.py)."""
RETIRED = "-"
"""The source of an entry whose memory went (an unregistered host range): fresh private
zero pages, so that work outliving it touches nothing shared and never a PROT_NONE page."""


def _mmap(address: int | None, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    result = _libc.mmap(address, length, prot, flags, fd, offset)
    if result == _MAP_FAILED or result is None:
        raise OSError(ctypes.get_errno(), "mmap of device memory failed")
    return int(result)


def reserve(length: int = DEVICE_SPAN) -> int:
    """Reserve `length` bytes of address space, PROT_NONE: the address of its start."""
    return _mmap(None, length, _PROT_NONE, _RESERVE, -1, 0)


def reserve_mmap(length: int = DEVICE_SPAN) -> mmap.mmap:
    """A Python mmap of `length` bytes of reserved address space (PROT_NONE: touching it
    before something is mapped into it is a SIGSEGV), for buffer and madvise access."""
    window = mmap.mmap(-1, length, flags=_RESERVE)  # read-write for Python; no pages, no charge
    base = ctypes.addressof(ctypes.c_char.from_buffer(window))
    _mmap(base, length, _PROT_NONE, _RESERVE | _MAP_FIXED, -1, 0)
    return window


def map_shared(base: int, fd: int, mappings: Iterable[Mapping]) -> None:
    """Map each (window offset, length, segment offset) of the segment `fd` into the window
    at `base`, MAP_FIXED."""
    for offset, length, file_offset in mappings:
        _mmap(base + offset, length, _PROT_RW, mmap.MAP_SHARED | _MAP_FIXED, fd, file_offset)


def remap_reserved(base: int, old: set[Entry], new: set[Entry]) -> None:
    """Change the window's upper half (the reserved ranges) from mapping `old` to `new`:
    map what came (over what it replaces). Nothing mapped there is ever made PROT_NONE
    again (docs/device-memory.md: work that outlives an unmap); a source already unlinked
    is mapped as RETIRED."""
    for offset, length, file_offset, source in new - old:
        map_source(base, source, offset, length, file_offset)


def map_source(base: int, source: str, offset: int, length: int, file_offset: int) -> None:
    """Map `[file_offset, +length)` of the segment `source` at window offset `offset`;
    fresh private zero pages if it is RETIRED or gone (unlinked)."""
    if source == RETIRED or not map_segment(base, source, [(offset, length, file_offset)]):
        _mmap(base + offset, length, _PROT_RW, _RESERVE | _MAP_FIXED, -1, 0)


def map_segment(base: int, name: str, mappings: Iterable[Mapping]) -> bool:
    """Map `mappings` of the shared-memory segment `name` into the window at `base`; False
    if the segment is gone (unlinked)."""
    try:
        memory = posix_ipc.SharedMemory(name)
    except posix_ipc.ExistentialError:
        return False
    try:
        map_shared(base, memory.fd, mappings)
    finally:
        memory.close_fd()
    return True
