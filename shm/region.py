"""Named POSIX shared-memory regions: the device memory, pinned host buffers, staging areas.

The process that creates a region owns it and is the only one that unlinks it; others
attach by name with size 0 (a non-zero size would ftruncate, i.e. resize, the owner's
segment). Mappings stay valid after unlink until every process has closed them.

A new segment is a sparse tmpfs file: it costs RAM and /dev/shm space only for the pages
written. `commit` backs a range with pages now, `decommit` gives them back
(docs/device-memory.md). A device's segment is mapped as a window of the device's whole
address span (simnpu.shm.window), so that physical blocks mapped at reserved device
addresses (aclrtMapMem) are offsets of the same buffer.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import posix_ipc

from simnpu.shm import window
from simnpu.shm.pages import populate

NAME_PREFIX = "/simnpu"


def segment_name(*parts: object) -> str:
    """A segment name unique to this daemon: /simnpu-<daemon pid>-<parts...>."""
    return "-".join([NAME_PREFIX, str(os.getpid()), *map(str, parts)])


class Region:
    """One mapped shared-memory segment. Use create() or attach()."""

    def __init__(
        self,
        name: str,
        memory: posix_ipc.SharedMemory,
        owner: bool,
        populate: bool = False,
        device: bool = False,
    ):
        self.name = name
        self.owner = owner
        self.size = memory.size
        self.fd = -1  # kept open for a device's window: its pages are mapped into it again
        self._mapped: set[window.Entry] = set()  # what its reserved half maps
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
        try:
            if not self.size:
                raise ValueError(f"shared-memory segment {name} is empty")
            if device:
                self.map = window.reserve_mmap()
                length = (self.size + mmap.PAGESIZE - 1) & -mmap.PAGESIZE
                window.map_shared(self.address(), memory.fd, [(0, length, 0)])
                self.fd = os.dup(memory.fd)
            else:
                self.map = mmap.mmap(memory.fd, self.size, flags=flags)
        finally:
            memory.close_fd()
        self._closed = False

    def map_reserved(self, mappings: set[window.Entry]) -> None:
        """A device's window: its reserved half maps `mappings` (window offset, length,
        source offset, source: simnpu.shm.window.Entry), mapped over what they replace since
        the last call.
        Never blocks on anything but the kernel."""
        window.remap_reserved(self.address(), self._mapped, mappings)
        self._mapped = mappings

    def commit(self, offset: int, length: int) -> None:
        """Back `[offset, +length)` (page-aligned offset) with pages now, through this
        mapping (simnpu.shm.pages.populate). OSError if the pages cannot be had (a full
        /dev/shm, no memory): nothing of the range is then left committed."""
        try:
            populate(self.map, offset, length)
        except OSError:
            self.decommit(offset, length)
            raise

    def decommit(self, offset: int, length: int) -> None:
        """Give the pages of `[offset, +length)` (page-aligned offset) back to the system:
        madvise(MADV_REMOVE) punches a hole in the file and unmaps the pages from every
        process that maps them; reading the range later reads zeros. Never blocks on
        anything but the kernel."""
        self.map.madvise(mmap.MADV_REMOVE, offset, length)

    @classmethod
    def create(cls, name: str, size: int, reserve: bool = False, device: bool = False) -> Region:
        """Create a new segment of `size` bytes (fails if the name exists). reserve=True
        allocates its pages now (posix_fallocate), so that a /dev/shm too full for it fails
        here (OSError) rather than with a SIGBUS at the first write into a page. device=True
        maps it as a device's window."""
        memory = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        try:
            if reserve:
                os.posix_fallocate(memory.fd, 0, size)
            return cls(name, memory, owner=True, device=device)
        except BaseException:  # e.g. too big to map: the segment must not outlive the failure
            memory.close_fd()
            unlink_quietly(name)
            raise

    @classmethod
    def attach(cls, name: str, populate: bool = False, device: bool = False) -> Region:
        """Map an existing segment created by someone else; never resizes it.

        populate=True faults every page in now (MAP_POPULATE), so that the first copy into
        the memory runs at full speed instead of ~10x slower on first touch. device=True
        maps it as a device's window.
        """
        return cls(
            name, posix_ipc.SharedMemory(name), owner=False, populate=populate, device=device
        )

    def address(self) -> int:
        """The address of the mapping in this process (for ctypes / pyACL-style pointers)."""
        return ctypes.addressof(ctypes.c_char.from_buffer(self.map))

    def close(self) -> None:
        """Unmap (and unlink, if this process created it). Idempotent.

        Raises BufferError while numpy views of the mapping are alive; drop them first.
        """
        if self._closed:
            return
        if self.owner:
            unlink_quietly(self.name)  # first: the name goes even if views keep the mapping
            self.owner = False
        self.map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._closed = True

    def unlink(self) -> None:
        """Remove the name now (mappings stay valid); only for the owner."""
        if self.owner:
            unlink_quietly(self.name)


def shm_available_bytes(directory: str = "/dev/shm") -> int:
    """Bytes that new shared-memory segments can still take."""
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def unlink_quietly(name: str) -> None:
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


def unlink_daemon_segments(daemon_pid: int) -> None:
    """Remove every segment of daemon `daemon_pid` (all carry its pid in their names): the
    daemon's last sweep when it stops, and its workers' when it died without stopping them."""
    prefix = f"{NAME_PREFIX[1:]}-{daemon_pid}-"
    for name in os.listdir("/dev/shm"):
        if name.startswith(prefix):
            unlink_quietly("/" + name)
