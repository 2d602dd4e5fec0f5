"""Which file holds each page of a device's memory: a client's blocks live in a file of that
client alone, so that a process which maps them maps nothing of anyone else
(docs/kernel-isolation.md, "Memory: a file per client").

Addresses stay: the allocator keeps one address space per device. A block's pages live at
its own offset in its owner's file (`simnpu-<daemon>-s<session>-dev<d>`, sparse, sized like
the device); memory of no client (the daemon's, and what was never allocated) stays in the
device's own segment. Every process that maps the whole device -- the daemon, the workers,
an HCCL exchange -- composes its window from these files: a page run is mapped, MAP_FIXED,
from the file that backs it. The daemon maps a change at once; the others get the changes in
order before they next touch device memory (`BackingLog`, MapBacking).

Exported memory gets a file of its own: the pages of an allocation that its client exports
to another (an IPC key, a shareable handle) move, at the first export, into a file of that
allocation alone (`share`), so that an importer maps nothing else of the exporter; the file
goes with the allocation (`release`).
"""

from __future__ import annotations

import bisect
import ctypes
import os
import threading
from typing import NamedTuple

import posix_ipc

from simnpu.server.core.owner import Owner
from simnpu.shm import window
from simnpu.shm.region import Region, segment_name, unlink_quietly

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
_FALLOC_PUNCH_HOLE = 0x01 | 0x02  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE

LOG_KEPT = 4096
"""Changes the log keeps; a process further behind gets every device's whole map instead."""


class Backing(NamedTuple):
    """Page run `[offset, +length)` of device segment `segment` is mapped from `source` (a
    file name) at the same offset. Whole pages."""

    segment: str
    offset: int
    length: int
    source: str


class BackingLog:
    """Every device's changes of backing, in order, with a version that counts them: what
    the daemon's other mapping processes apply before they next touch device memory. Thread
    safe."""

    def __init__(self) -> None:
        self.version = 0
        self._first = 0  # the version of _changes[0]
        self._changes: list[Backing] = []
        self._maps: list[DeviceBacking] = []
        self._lock = threading.Lock()

    def add(self, device: DeviceBacking) -> None:
        with self._lock:
            self._maps.append(device)

    def record(self, changes: list[Backing]) -> None:
        with self._lock:
            self._changes += changes
            self.version += len(changes)
            if len(self._changes) > LOG_KEPT:
                cut = len(self._changes) - LOG_KEPT
                del self._changes[:cut]
                self._first += cut

    def since(self, version: int) -> tuple[int, tuple[Backing, ...], bool]:
        """(the version now, what changed after `version`, whole): whole=True when
        `version` is older than the log, and the changes are then every device's whole map
        (-1: a process that has seen nothing)."""
        with self._lock:
            now = self.version
            if version >= self._first:
                return now, tuple(self._changes[version - self._first :]), False
            maps = list(self._maps)
        # outside the log's lock (a device logs under its own): the maps are as new as `now`
        # or newer, and applying a change twice maps the same file again
        return now, tuple(run for device in maps for run in device.runs()), True


def _make_file(name: str, size: int) -> None:
    """A new sparse segment `name` of `size` bytes for a client's memory."""
    posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size).close_fd()


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of `data` at `offset` of file `fd` (pwrite writes at most ~2 GiB a call)."""
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _drop_file(name: str) -> None:
    """Give back the pages of segment `name` and unlink it: processes that still map it
    (work that outlived a free) read zeros until their next change of backing."""
    try:
        memory = posix_ipc.SharedMemory(name)
    except posix_ipc.ExistentialError:
        return
    try:
        _libc.fallocate(memory.fd, _FALLOC_PUNCH_HOLE, 0, memory.size)
    finally:
        memory.close_fd()
        unlink_quietly(name)


class DeviceBacking:
    """One device's page runs and the file of each (the device's own segment for memory of
    no client); maps each change into the daemon's window of the device (`region`) and logs
    it. Thread safe; a caller that allocates holds the device's lock, so that changes are
    logged in the order the blocks were handed out."""

    def __init__(self, index: int, region: Region, log: BackingLog):
        self.index = index
        self.region = region
        self.log = log  # where its changes go, for the other processes that map the device
        self._lock = threading.Lock()
        self._starts = [0]  # run starts, sorted; the runs cover the whole device
        self._runs: list[tuple[int, str]] = [(region.size, region.name)]  # (end, source)
        self._files: dict[int, str] = {}  # session id -> the name of its file
        self._shared: dict[int, str] = {}  # block offset -> the file of its exported pages
        log.add(self)

    def runs(self) -> list[Backing]:
        with self._lock:
            return [
                Backing(self.region.name, start, end - start, source)
                for start, (end, source) in zip(self._starts, self._runs)
            ]

    def source_of(self, owner: object) -> str:
        """The file `owner`'s blocks live in (the device's segment for no client)."""
        if not isinstance(owner, Owner):
            return self.region.name
        with self._lock:
            return self._files.get(owner.id, self.region.name)

    def assign(self, offset: int, length: int, owner: object) -> None:
        """A block `[offset, +length)` (whole pages) now belongs to `owner`: back it with
        its file (made at its first block), in the daemon's window now and in the log. What
        backed a piece of it before (stale pages of a freed block) is punched out of that
        file first, so a block never shows another client's old bytes. OSError if the
        file cannot be made."""
        with self._lock:
            source = self._source(owner)
            changes = []
            for start, size, old in self._pieces(offset, length):
                if old == source:
                    continue
                self.region.decommit(start, size)  # through the old mapping: the old file's
                self._map(source, start, size)
                changes.append(Backing(self.region.name, start, size, source))
            if changes:
                self._set(offset, offset + length, source)
                self.log.record(changes)

    def unshared(self, block: int, offset: int, length: int) -> bool:
        """Whether pages of `[offset, +length)`, in the block at `block`, are still in a
        file that holds more than that block's exported pages (`share` has work to do)."""
        with self._lock:
            name = self._shared.get(block)
            return any(source != name for _, _, source in self._pieces(offset, length))

    def share(self, block: int, offset: int, length: int, owner: Owner) -> list[Backing]:
        """`[offset, +length)` (whole pages of `owner`'s block at `block`) is exported: its
        pages move into the block's own file (made at its first export), their bytes
        copied, in the daemon's window and in the log; they are punched out of the owner's
        file. The caller sees to it that nothing writes them meanwhile (Scheduler.quiet).
        The copy holds no lock: other devices' and clients' changes go on. Returns the
        changes. OSError if the file cannot be made or written."""
        with self._lock:
            name = self._shared.get(block)
            if name is None:
                name = segment_name(f"s{owner.id}", f"dev{self.index}", f"b{block:x}")
                _make_file(name, self.region.size)
                self._shared[block] = name
            pieces = [piece for piece in self._pieces(offset, length) if piece[2] != name]
        memory = posix_ipc.SharedMemory(name)
        try:
            with memoryview(self.region.map) as view:
                for start, size, _ in pieces:
                    _write_all(memory.fd, view[start : start + size], start)
        finally:
            memory.close_fd()
        with self._lock:
            changes = []
            for start, size, old in pieces:
                if self._pieces(start, size) != [(start, size, old)]:
                    continue  # (the block went meanwhile: nothing to move)
                self.region.decommit(start, size)  # through the old mapping: its file's
                self._map(name, start, size)
                self._set(start, start + size, name)
                changes.append(Backing(self.region.name, start, size, name))
            self.log.record(changes)
            return changes

    def release(self, block: int) -> None:
        """The block at `block` went back to the allocator: the pages of its own file (if
        it was exported) go back to the device's segment, and the file goes."""
        with self._lock:
            name = self._shared.pop(block, None)
            if name is None:
                return
            self._back_to_segment(name)

    def sources(self, offset: int, length: int) -> list[tuple[int, int, str]]:
        """(offset, length, file) of the runs that back `[offset, +length)`, in order."""
        with self._lock:
            return self._pieces(offset, length)

    def owner_gone(self, owner: object) -> None:
        """`owner` ended and holds no block of this device any more: its runs go back to
        the device's segment and its file goes."""
        if not isinstance(owner, Owner):
            return
        with self._lock:
            name = self._files.pop(owner.id, None)
            if name is not None:
                self._back_to_segment(name)

    def close(self) -> None:
        """The daemon stops: every client's file goes."""
        with self._lock:
            for name in [*self._files.values(), *self._shared.values()]:
                _drop_file(name)
            self._files.clear()
            self._shared.clear()

    def _back_to_segment(self, name: str) -> None:
        """Every run of file `name` goes back to the device's segment; the file goes."""
        own = self.region.name
        changes = [
            Backing(own, start, end - start, own)
            for start, (end, source) in zip(self._starts, self._runs)
            if source == name
        ]
        for change in changes:
            self._map(own, change.offset, change.length)
            self._set(change.offset, change.offset + change.length, own)
        self.log.record(changes)
        _drop_file(name)

    def _source(self, owner: object) -> str:
        if not isinstance(owner, Owner):
            return self.region.name
        name = self._files.get(owner.id)
        if name is None:
            name = segment_name(f"s{owner.id}", f"dev{self.index}")
            _make_file(name, self.region.size)
            self._files[owner.id] = name
        return name

    def _map(self, source: str, offset: int, length: int) -> None:
        """Map `[offset, +length)` of `source` at the same offset of the daemon's window."""
        if source == self.region.name:
            window.map_shared(self.region.address(), self.region.fd, [(offset, length, offset)])
        elif not window.map_segment(self.region.address(), source, [(offset, length, offset)]):
            raise OSError(f"the memory file {source} is gone")

    def _pieces(self, offset: int, length: int) -> list[tuple[int, int, str]]:
        end = offset + length
        pieces = []
        i = bisect.bisect_right(self._starts, offset) - 1
        while offset < end:
            run_end, source = self._runs[i]
            piece_end = min(run_end, end)
            pieces.append((offset, piece_end - offset, source))
            offset, i = piece_end, i + 1
        return pieces

    def _set(self, start: int, end: int, source: str) -> None:
        """Runs: `[start, end)` is `source`'s, merged with equal neighbours."""
        starts, runs = self._starts, self._runs
        i = bisect.bisect_right(starts, start) - 1
        if starts[i] < start:  # split the run that holds start
            runs.insert(i + 1, runs[i])
            starts.insert(i + 1, start)
            runs[i] = (start, runs[i][1])
            i += 1
        j = bisect.bisect_left(starts, end)  # the first run starting at or after end
        if runs[j - 1][0] > end:  # split the run that holds end
            runs.insert(j, runs[j - 1])
            starts.insert(j, end)
            runs[j - 1] = (end, runs[j - 1][1])
        del starts[i + 1 : j]
        del runs[i + 1 : j]
        runs[i] = (end, source)
        if i + 1 < len(starts) and runs[i + 1][1] == source:  # merge with the next
            runs[i] = runs[i + 1]
            del starts[i + 1], runs[i + 1]
        if i > 0 and runs[i - 1][1] == source:  # merge with the previous
            runs[i - 1] = runs[i]
            del starts[i], runs[i]
