"""The memory a unit reads and writes by `Span` (server/core/unit_protocol.py): the device
segments its process maps, and host segments (pinned memory, staging areas, notify areas)
mapped by name on first use; copies and fills of bytes, large writes prefaulted."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

from simnpu.server.core.unit_protocol import Span
from simnpu.shm.pages import PageTable, populate
from simnpu.shm.region import Region

PREFAULT_MIN = 1 << 20  # a device write from this size on maps its pages first (prefault)


class SpanMemory:
    """Device segments by name (`device_maps[i]` is segment `device_segments[i]`), and the
    host segments mapped so far."""

    def __init__(self, device_segments: list[str], device_maps: list):
        self.segments: dict[str, mmap.mmap | bytearray] = dict(zip(device_segments, device_maps))
        self._host: dict[str, Region] = {}
        self._pages = PageTable()  # whether this process has touched device pages yet
        self._bases: dict[str, int] = {}  # device segment -> the address of its mapping here

    def bytes(self, span: Span, count: int) -> memoryview:
        """Bytes [span, +count) of the memory `span` names."""
        memory = self.segments.get(span.segment)
        if memory is None:
            memory = self.host_segment(span.segment).map
        if span.offset < 0 or span.offset + count > len(memory):
            raise IndexError(
                f"range [{span.offset}, +{count}) outside the {len(memory)} bytes of "
                f"{'device' if span.device >= 0 else 'host'} memory"
            )
        return memoryview(memory)[span.offset : span.offset + count]

    def copy(self, dst: Span, src: Span, count: int) -> None:
        self.prefault(dst, count)
        with self.bytes(dst, count) as target, self.bytes(src, count) as source:
            target[:] = source

    def fill(self, dst: Span, value: int, count: int) -> None:
        self.prefault(dst, count)
        with self.bytes(dst, count) as target:
            np.frombuffer(target, np.uint8).fill(value)

    def prefault(self, dst: Span, count: int) -> None:
        """Before writing `count` bytes (PREFAULT_MIN or more) of device memory that this
        process has not touched since it was committed (its first page is not in the page
        table), map the range's pages with one madvise instead of a fault per page
        (docs/device-memory.md). OSError if the pages cannot be had (memory freed and given
        back meanwhile, on a full /dev/shm): the task fails instead of a SIGBUS."""
        memory = self.segments.get(dst.segment)
        if count < PREFAULT_MIN or not isinstance(memory, mmap.mmap):
            return
        base = self._bases.get(dst.segment)
        if base is None:
            base = self._bases[dst.segment] = ctypes.addressof(ctypes.c_char.from_buffer(memory))
        if not self._pages.present(base + dst.offset):
            start = dst.offset & -mmap.PAGESIZE
            populate(memory, start, dst.offset + count - start)

    def host_segment(self, name: str) -> Region:
        region = self._host.get(name)
        if region is None:
            region = self._host[name] = Region.attach(name, populate=True)
        return region

    def forget(self, name: str) -> None:
        """Host segment `name` was unlinked: drop this process's mapping of it."""
        region = self._host.pop(name, None)
        if region is not None:
            region.close()
