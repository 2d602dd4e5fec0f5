"""Pages of shared memory in this process: backing a range with pages at once, and whether
this process's page table has a page yet (docs/device-memory.md).

Writing a page of a shared-memory file faults once per 4 KiB page in every process that
maps it: in a process that has not touched the range, a 256 MiB copy then runs at a fifth
of its warm speed. One madvise(MADV_POPULATE_WRITE) over the range does the same work
several times faster, and allocates pages where the file has none (a commit).
"""

from __future__ import annotations

import errno
import mmap
import os

MADV_POPULATE_WRITE = 23  # linux/mman.h, Linux >= 5.14 (Python 3.11's mmap has no name for it)
_PRESENT = 1 << 63  # /proc/<pid>/pagemap: the page is in the page table


def populate(memory: mmap.mmap, offset: int, length: int) -> None:
    """Fill `[offset, +length)` of the mapping `memory` (page-aligned offset) with pages,
    written: madvise(MADV_POPULATE_WRITE), else (kernels before 5.14) a write of one zero
    byte per page. OSError if the pages cannot be had (a full /dev/shm, no memory)."""
    try:
        memory.madvise(MADV_POPULATE_WRITE, offset, length)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        view = memoryview(memory)
        try:
            view[offset : offset + length : mmap.PAGESIZE] = bytes(-(-length // mmap.PAGESIZE))
        finally:
            view.release()


class PageTable:
    """This process's page table, read from /proc/self/pagemap (opened on first use)."""

    def __init__(self) -> None:
        self._fd = -1

    def present(self, address: int) -> bool:
        """Whether the page holding `address` is mapped in this process now."""
        if self._fd < 0:
            self._fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        entry = os.pread(self._fd, 8, address // mmap.PAGESIZE * 8)
        return bool(int.from_bytes(entry, "little") & _PRESENT)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
