"""Device-memory allocator for one simulated device: offsets in one region, metadata kept
outside it.

Mirrors what the driver does behind aclrtMalloc/aclrtFree. It hands out offsets in
`[0, capacity)` and never touches the memory itself (TLSF-EXT style: no headers in the
client-visible region), so it is tested without shared memory.

Algorithm: address-ordered best fit. The free set (`FreeSet`) is ordered by `(size, offset)`
(stored as one int, `size << shift | offset`, which sorts the same and compares faster
than a tuple): the first entry >= the request is the smallest block that fits, lowest
address on ties; it is binned by size like TLSF, so a look-up is O(1) bin arithmetic plus
a bisect in one short bin.
The chosen block is split; on free a block merges at once with free physical neighbours,
found in O(1) through the dicts `start -> size` and `end -> start`. Live blocks are
indexed by 1 MiB page (the starts in each page, sorted, and the block covering each page's
first byte), so `lookup` of any interior offset is O(1) plus a bisect within one page.

Sizes follow ACL: `ALIGN_UP(size, 32) + 32`, then up to the start alignment `align` (so
every block boundary stays aligned and no split leaves a sliver under `align` bytes;
the only possible sliver, at an unaligned capacity end, is absorbed into the block next
to it). Huge placement (a logical policy: /dev/shm is not huge-page backed) rounds up to
a multiple of `huge_granule` and starts on a granule boundary. `align` is 64 bytes by
default; the daemon's devices use the 4 KiB page, so no two blocks share a page and a
process can be given exactly one client's blocks (docs/kernel-isolation.md).

Huge placement: one arena with an alignment constraint. Huge and normal blocks share one
free set and one address order; a huge request takes the best-fit block among those that
hold a granule-aligned window, and the lowest such window in it. Two arenas growing toward
each other (huge blocks from the top, normal from the bottom) were measured against it and
fragment a little more, so they were not kept. Utilisation (requested / capacity) at the
first failed HUGE_FIRST allocation, 1 GiB, mean of 40 seeds, and the worst
largest-free / free seen on a DL-like trace (15 seeds):

    trace                                    one arena   two ends
    random, 70% 512 B-1 MiB, 40% frees         0.846      0.835
    random, same, 45% frees                    0.823      0.806
    small/large phases                         0.878      0.877
    DL-like, worst largest_free / free         0.440      0.416

Why: best fit already segregates by size (small requests go to the smallest holes), so a
second arena adds no segregation of its own; the two rules differ only in which side of
the chosen block gets the sub-granule alignment gap. The lowest window puts that gap
against memory already in use, where later small blocks fill it; and one address order is
simpler. Top placement's one advantage, huge blocks packed edge to edge on a fresh region,
did not show up in the numbers. The margin is small (0-2.5 points).

Per-owner totals (`used_by`, `usage_by_owner`) are kept up to date, so a per-owner limit
(the daemon's memory quotas) is one more placement constraint: `allocate(..., limit=n)`
places nothing that would take the owner past n reserved bytes.

Speed (the daemon serves malloc/free from here): see `bench/memory_bench.py`. What it costs
is CPython interpretation (every bytecode counts), so the hot paths are written flat: no
lock of its own, counters are plain attributes updated with `if`, "freed" totals are
derived (allocated - current), `Allocation`s are built with `tuple.__new__`, the normal
placement and the release are written out in `allocate`/`free`, and the free set is a
size-binned list of sorted lists, not a `SortedList`.

Thread safety: none of its own. The caller serialises calls (the daemon holds `Device.lock`).
"""

from __future__ import annotations

import operator
from bisect import bisect_right, insort
from collections.abc import Hashable
from typing import Any, NamedTuple

from simnpu.proto import codes
from simnpu.proto.errors import NotSupportedError, NpuError, NpuMemoryError
from simnpu.shm.freeset import FreeSet

ALIGN = 64
"""The smallest start alignment of a block (the default), and the smallest block kept."""

PAD = 32
"""ACL adds 32 bytes after rounding the size up to 32."""

_HUGE_FIRST, _HUGE_ONLY, _NORMAL_ONLY, _HUGE1G = 0, 1, 2, 3

_MODE_OF_POLICY = {
    codes.ACL_MEM_MALLOC_HUGE_FIRST: _HUGE_FIRST,
    codes.ACL_MEM_MALLOC_HUGE_ONLY: _HUGE_ONLY,
    codes.ACL_MEM_MALLOC_NORMAL_ONLY: _NORMAL_ONLY,
    codes.ACL_MEM_MALLOC_HUGE_FIRST_P2P: _HUGE_FIRST,
    codes.ACL_MEM_MALLOC_HUGE_ONLY_P2P: _HUGE_ONLY,
    codes.ACL_MEM_MALLOC_NORMAL_ONLY_P2P: _NORMAL_ONLY,
    codes.ACL_MEM_MALLOC_HUGE1G_ONLY: _HUGE1G,
    codes.ACL_MEM_MALLOC_HUGE1G_ONLY_P2P: _HUGE1G,
}

_POLICY_NAMES = {
    codes.ACL_MEM_MALLOC_HUGE_FIRST: "ACL_MEM_MALLOC_HUGE_FIRST",
    codes.ACL_MEM_MALLOC_HUGE_ONLY: "ACL_MEM_MALLOC_HUGE_ONLY",
    codes.ACL_MEM_MALLOC_NORMAL_ONLY: "ACL_MEM_MALLOC_NORMAL_ONLY",
    codes.ACL_MEM_MALLOC_HUGE_FIRST_P2P: "ACL_MEM_MALLOC_HUGE_FIRST_P2P",
    codes.ACL_MEM_MALLOC_HUGE_ONLY_P2P: "ACL_MEM_MALLOC_HUGE_ONLY_P2P",
    codes.ACL_MEM_MALLOC_NORMAL_ONLY_P2P: "ACL_MEM_MALLOC_NORMAL_ONLY_P2P",
    codes.ACL_MEM_MALLOC_HUGE1G_ONLY: "ACL_MEM_MALLOC_HUGE1G_ONLY",
    codes.ACL_MEM_MALLOC_HUGE1G_ONLY_P2P: "ACL_MEM_MALLOC_HUGE1G_ONLY_P2P",
}

_FREED_MEMORY = 4096
"""At least this many freed starts are remembered to tell a double free from a wild pointer."""

_TOP_USERS = 5

_PAGE_SHIFT = 20
"""`lookup` index pages are 1 MiB: a block costs one entry per page it reaches past its first."""


class Allocation(NamedTuple):
    """One live block: `[offset, offset + reserved)` of the region belongs to `owner`.

    Immutable (a NamedTuple: cheapest immutable record to create in CPython).
    """

    offset: int
    size: int
    """The size the caller asked for."""
    reserved: int
    """Bytes taken from the region: padding, 64-byte rounding, or whole huge granules."""
    owner: Any
    huge: bool
    """Placed as `huge_granule`-sized, granule-aligned ("huge page") memory."""

    @property
    def end(self) -> int:
        return self.offset + self.reserved


_new_allocation = tuple.__new__  # Allocation(...) without the generated __new__'s call overhead


class _Former:
    """The owner of a freed block, as messages name it: the owner itself, remembered, would
    keep alive a client long gone and everything it held."""

    __slots__ = ("text",)

    def __init__(self, owner: Any):
        self.text = repr(owner)

    def __repr__(self) -> str:
        return self.text


def policy_name(policy: int) -> str:
    """`ACL_MEM_MALLOC_*` name of a policy, with its flag bits, for messages."""
    base = policy & 0xFF
    name = _POLICY_NAMES.get(base, f"unknown policy {base} (treated as ACL_MEM_MALLOC_HUGE_FIRST)")
    flags = policy & ~0xFF
    return f"{name} | {flags:#x}" if flags else name


def _fmt_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n} B ({n / (1 << shift):.2f} {unit})"
    return f"{n} B"


class DeviceAllocator:
    """Best-fit allocator of one device's memory region; mirrors the driver behind aclrtMalloc."""

    def __init__(
        self,
        capacity: int,
        huge_granule: int = 2 << 20,
        huge_threshold: int = 1 << 20,
        align: int = ALIGN,
    ):
        capacity = operator.index(capacity)
        align = operator.index(align)
        if align < ALIGN or align & (align - 1):
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"align {align} must be a power of two of at least {ALIGN}",
            )
        huge_granule = operator.index(huge_granule)
        huge_threshold = operator.index(huge_threshold)
        if capacity < align:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"capacity {capacity} is below {align} bytes"
            )
        if huge_granule <= 0 or huge_granule % align:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"huge_granule {huge_granule} must be a positive multiple of {align}",
            )
        if huge_threshold < 0:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, f"huge_threshold {huge_threshold} is negative"
            )
        self._capacity = capacity
        self._align = align  # every block starts and ends on a multiple (bar the capacity end)
        self._granule = huge_granule
        self._threshold = huge_threshold

        # Free set: keys `size << shift | start` in best-fit order, plus boundary maps for
        # O(1) merging. Every start is < 2**shift, so the key order is (size, start) order.
        self._shift = shift = capacity.bit_length()
        self._mask = (1 << shift) - 1
        self._free = FreeSet(shift, [capacity << shift])
        self._free_at: dict[int, int] = {0: capacity}  # start -> size
        self._free_end: dict[int, int] = {capacity: 0}  # end -> start
        self._free_bytes = capacity

        # Live blocks: start -> Allocation, and an address index for `lookup`: the region
        # is cut in 2**_PAGE_SHIFT-byte pages; `_starts[page]` lists (sorted) the starts of
        # the live blocks that begin in the page, `_covers[page]` the start of the one live
        # block, begun in an earlier page, that covers the page's first byte.
        self._live: dict[int, Allocation] = {}
        self._starts: dict[int, list[int]] = {}
        self._covers: dict[int, int] = {}
        self._by_owner: dict[Any, int] = {}  # owner -> reserved bytes, owners with live blocks only
        # Starts freed lately (kept for messages only, their owners by name): a free of one
        # of these that is not live again and not inside a live block is a double free.
        self._freed: dict[int, Allocation] = {}
        # (start, size) of the free block the last free() left its block in, merged
        self.freed_block = (0, 0)

        # Counters (torch.cuda.memory_stats names in stats()); "freed" = allocated - current.
        self._huge_cur = self._huge_peak = self._huge_alloc = 0
        self._norm_peak = 0
        self._all_alloc = self._all_peak = 0
        self._req_cur = self._req_peak = 0
        self._n_peak = self._n_alloc = 0
        self._num_ooms = 0

    # ---------------------------------------------------------------- public API

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def free_bytes(self) -> int:
        return self._free_bytes

    @property
    def largest_free_block(self) -> int:
        return self._largest()

    def allocate(
        self, size: int, policy: int = 0, owner: Hashable = None, limit: int | None = None
    ) -> Allocation:
        """Mirrors aclrtMalloc(devPtr, size, policy); raises NpuMemoryError when it does not fit.

        `limit`, if given, caps the bytes `owner` may have reserved in all (a quota): a
        placement that would take the owner past it is not made (HUGE_FIRST then tries
        normal memory), and when nothing fits the error says the limit was the reason.
        """
        if size.__class__ is not int or policy.__class__ is not int:
            size, policy = _as_ints(size, policy)
        if size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"size must be positive, got {size}")
        mode = _MODE_OF_POLICY.get(policy & 0xFF, _HUGE_FIRST)
        align = self._align
        want = (((size + 31) & -32) + PAD + align - 1) & -align  # ACL: ALIGN_UP(size,32)+32
        huge = False
        if mode == _NORMAL_ONLY or (mode == _HUGE_FIRST and size <= self._threshold):
            # The common case, written out (_take_normal does the same for fallbacks).
            key = None
            if limit is None or want <= limit - self._by_owner.get(owner, 0):
                key = self._free.pop_ceil(want << self._shift)
            if key is None:
                self._num_ooms += 1
                raise NpuMemoryError(self._oom_message(size, policy, mode, owner, limit))
            offset = key & self._mask
            block = key >> self._shift
            end = offset + block
            del self._free_at[offset]
            tail = block - want
            if tail < align:  # never leave a sliver; only an unaligned capacity end can
                want = block  # cause one
                del self._free_end[end]
            else:  # the remainder keeps the block's end
                rest = offset + want
                self._free.add(tail << self._shift | rest)
                self._free_at[rest] = tail
                self._free_end[end] = rest
            self._free_bytes -= want
        else:
            offset, want, huge = self._place_huge(size, policy, mode, want, owner, limit)
        a = _new_allocation(Allocation, (offset, size, want, owner, huge))
        self._live[offset] = a
        page = offset >> _PAGE_SHIFT
        starts = self._starts.get(page)
        if starts is None:
            self._starts[page] = [offset]
        else:
            insort(starts, offset)
        if (offset + want - 1) >> _PAGE_SHIFT != page:
            self._cover(page + 1, ((offset + want - 1) >> _PAGE_SHIFT) + 1, offset)
        by_owner = self._by_owner
        by_owner[owner] = by_owner.get(owner, 0) + want
        # Counters, flat: normal = all - huge, freed = allocated - current.
        cur = self._capacity - self._free_bytes
        if cur > self._all_peak:  # noqa: PLR1730 (an if is cheaper than max())
            self._all_peak = cur
        self._all_alloc += want
        if huge:
            self._huge_alloc += want
            cur = self._huge_cur = self._huge_cur + want
            if cur > self._huge_peak:  # noqa: PLR1730 (an if is cheaper than max())
                self._huge_peak = cur
        elif cur - self._huge_cur > self._norm_peak:
            self._norm_peak = cur - self._huge_cur
        cur = self._req_cur = self._req_cur + size
        if cur > self._req_peak:  # noqa: PLR1730 (an if is cheaper than max())
            self._req_peak = cur
        self._n_alloc += 1
        if len(self._live) > self._n_peak:  # noqa: PLR1730 (an if is cheaper than max())
            self._n_peak = len(self._live)
        return a

    def _place_huge(
        self, size: int, policy: int, mode: int, normal: int, owner: Hashable, limit: int | None
    ) -> tuple[int, int, bool]:
        """(offset, reserved, huge) for HUGE_ONLY and for HUGE_FIRST over the threshold."""
        if mode == _HUGE1G:
            raise NotSupportedError("1 GiB huge pages (ACL_MEM_MALLOC_HUGE1G_ONLY)")
        budget = None if limit is None else limit - self._by_owner.get(owner, 0)
        g = self._granule
        granules = -(-(((size + 31) & -32) + PAD) // g) * g
        if budget is None or granules <= budget:
            placed = self._take_huge(granules)
            if placed is not None:
                return placed[0], placed[1], True
        if mode != _HUGE_ONLY and (budget is None or normal <= budget):
            placed = self._take_normal(normal)
            if placed is not None:
                return placed[0], placed[1], False
        self._num_ooms += 1
        raise NpuMemoryError(self._oom_message(size, policy, mode, owner, limit))

    def free(self, offset: int) -> Allocation:
        """Mirrors aclrtFree(devPtr): `offset` must be the start of a live allocation. Never
        waits."""
        if offset.__class__ is not int:
            offset = operator.index(offset)
        a = self._live.pop(offset, None)
        if a is None:
            raise NpuError(codes.ACL_ERROR_RT_MEMORY_FREE, self._bad_free_message(offset))
        _, size, reserved, owner, huge = a
        page = offset >> _PAGE_SHIFT
        starts = self._starts[page]
        if len(starts) == 1:
            del self._starts[page]
        else:
            starts.remove(offset)
        last = (offset + reserved - 1) >> _PAGE_SHIFT
        if last != page:
            self._cover(page + 1, last + 1, None)
        left = self._by_owner[owner] - reserved
        if left:
            self._by_owner[owner] = left
        else:  # an owner without blocks is forgotten: it may be a session long gone
            del self._by_owner[owner]
        # Return the block to the free set, merged with its free neighbours (as _release).
        self._free_bytes += reserved
        end = offset + reserved
        shift = self._shift
        free, free_at, free_end = self._free, self._free_at, self._free_end
        start = free_end.pop(offset, None)
        if start is None:
            start = offset
        else:
            free.remove((offset - start) << shift | start)
        nsize = free_at.pop(end, None)
        if nsize is not None:
            free.remove(nsize << shift | end)
            end += nsize
        free.add((end - start) << shift | start)
        free_at[start] = end - start
        free_end[end] = start
        self.freed_block = (start, end - start)
        freed = self._freed
        freed[offset] = _new_allocation(Allocation, (offset, size, reserved, _Former(owner), huge))
        if len(freed) > 2 * _FREED_MEMORY:  # keep the newest, trimmed in bulk
            self._freed = dict(list(freed.items())[-_FREED_MEMORY:])
        if huge:
            self._huge_cur -= reserved
        self._req_cur -= size
        return a

    def withdraw(self, offset: int) -> Allocation:
        """Undo the allocation just made at `offset`, which cannot be used (the host cannot
        back it with pages): it is freed and counted as a failed allocation, not as one made."""
        a = self.free(offset)
        self._all_alloc -= a.reserved
        if a.huge:
            self._huge_alloc -= a.reserved
        self._n_alloc -= 1
        self._num_ooms += 1
        return a

    def lookup(self, address_offset: int) -> Allocation | None:
        """The live allocation whose `[offset, offset + reserved)` contains the offset, else
        None."""
        return self._containing(operator.index(address_offset))

    def used_by(self, owner: Hashable) -> int:
        """Reserved bytes of `owner`'s live blocks (O(1))."""
        return self._by_owner.get(owner, 0)

    def usage_by_owner(self) -> dict[Any, int]:
        """Reserved bytes per owner (only owners with live blocks)."""
        return dict(self._by_owner)

    def snapshot(self) -> list[dict[str, Any]]:
        """Live blocks in address order."""
        live = self._live
        return [
            {
                "offset": a.offset,
                "size": a.size,
                "reserved": a.reserved,
                "owner": a.owner,
                "huge": a.huge,
            }
            for a in (live[off] for off in sorted(live))
        ]

    def free_blocks(self) -> list[tuple[int, int]]:
        """Free blocks as `(offset, size)` in address order (diagnostics)."""
        return sorted(self._free_at.items())

    def stats(self) -> dict[str, int | float]:
        """Counters under torch.cuda.memory_stats key names, plus simnpu's free-space figures."""
        cur = self._capacity - self._free_bytes
        norm_cur = cur - self._huge_cur
        largest = self._largest()
        huge_alloc, norm_alloc = self._huge_alloc, self._all_alloc - self._huge_alloc
        n_cur = len(self._live)
        return {
            "allocated_bytes.all.current": cur,
            "allocated_bytes.all.peak": self._all_peak,
            "allocated_bytes.all.allocated": huge_alloc + norm_alloc,
            "allocated_bytes.all.freed": huge_alloc + norm_alloc - cur,
            "allocated_bytes.huge.current": self._huge_cur,
            "allocated_bytes.huge.peak": self._huge_peak,
            "allocated_bytes.huge.allocated": huge_alloc,
            "allocated_bytes.huge.freed": huge_alloc - self._huge_cur,
            "allocated_bytes.normal.current": norm_cur,
            "allocated_bytes.normal.peak": self._norm_peak,
            "allocated_bytes.normal.allocated": norm_alloc,
            "allocated_bytes.normal.freed": norm_alloc - norm_cur,
            "requested_bytes.all.current": self._req_cur,
            "requested_bytes.all.peak": self._req_peak,
            # No streams hold freed blocks back, so active == allocated.
            "active_bytes.all.current": cur,
            "active_bytes.all.peak": self._all_peak,
            "reserved_bytes.all.current": self._capacity,
            "allocation.all.current": n_cur,
            "allocation.all.peak": self._n_peak,
            "allocation.all.allocated": self._n_alloc,
            "allocation.all.freed": self._n_alloc - n_cur,
            "num_alloc_retries": 0,
            "num_ooms": self._num_ooms,
            "largest_free_block": largest,
            "free_bytes": self._free_bytes,
            "num_free_blocks": len(self._free),
            "fragmentation": 1.0 - largest / self._free_bytes if self._free_bytes else 0.0,
            "capacity": self._capacity,
        }

    def __repr__(self) -> str:
        return (
            f"DeviceAllocator(capacity={self._capacity}, free={self._free_bytes}, "
            f"live={len(self._live)}, free_blocks={len(self._free)})"
        )

    # ---------------------------------------------------------------- placement

    def _largest(self) -> int:
        last = self._free.last()
        return last >> self._shift if last is not None else 0

    def _take_normal(self, want: int) -> tuple[int, int] | None:
        """Best fit: smallest free block >= want, lowest address on ties; place at its start."""
        shift = self._shift
        key = self._free.pop_ceil(want << shift)
        if key is None:
            return None
        start = key & self._mask
        size = key >> shift
        end = start + size
        del self._free_at[start]
        tail = size - want
        if tail < self._align:  # never a sliver; only an unaligned capacity end makes one
            want = size
            del self._free_end[end]
        else:  # the remainder keeps the block's end
            rest = start + want
            self._free.add(tail << shift | rest)
            self._free_at[rest] = tail
            self._free_end[end] = rest
        self._free_bytes -= want
        return start, want

    def _take_huge(self, want: int) -> tuple[int, int] | None:
        """Best fit among blocks that hold a granule-aligned window of `want` bytes; lowest window.

        Blocks are visited in (size, start) order, so the first that holds a window is the
        best fit. Starts are 64-aligned, so any block of `want + granule - ALIGN` bytes or
        more holds one: the scan only skips blocks smaller than that (worst case, all free
        blocks sized in `[want, want + granule)` and none holding a window: O(log n + k)).
        """
        g, shift, mask = self._granule, self._shift, self._mask
        for key in self._free.irange(want << shift):
            start = key & mask
            size = key >> shift
            offset = -(-start // g) * g
            if offset + want <= start + size:
                self._free.remove(key)
                return self._carve(size, start, offset, want)
        return None

    def _carve(self, size: int, start: int, offset: int, want: int) -> tuple[int, int]:
        """Take `[offset, offset + want)` out of free block `(size, start)`; return
        (offset, reserved).

        The caller has already removed the block's key from `_free`.
        """
        del self._free_at[start]
        end = start + size
        del self._free_end[end]
        tail = end - offset - want
        if tail < self._align:  # never a sliver; only an unaligned capacity end makes one
            want += tail
            tail = 0
        if offset > start:
            self._add_free(start, offset - start)
        if tail:
            self._add_free(end - tail, tail)
        self._free_bytes -= want
        return offset, want

    def _add_free(self, start: int, size: int) -> None:
        self._free.add(size << self._shift | start)
        self._free_at[start] = size
        self._free_end[start + size] = start

    def _containing(self, offset: int) -> Allocation | None:
        """O(1) pages, then O(log k) in the page's k starts."""
        page = offset >> _PAGE_SHIFT
        starts = self._starts.get(page)
        start = None
        if starts is not None:
            i = bisect_right(starts, offset)
            if i:
                start = starts[i - 1]
        if start is None:
            start = self._covers.get(page)
            if start is None:
                return None
        a = self._live[start]
        return a if offset < start + a.reserved else None

    def _cover(self, first: int, stop: int, start: int | None) -> None:
        """Mark pages [first, stop) as covered by the block at `start` (None: uncovered)."""
        covers = self._covers
        if start is None:
            for page in range(first, stop):
                del covers[page]
        else:
            for page in range(first, stop):
                covers[page] = start

    # ---------------------------------------------------------------- messages

    def _oom_message(
        self, size: int, policy: int, mode: int, owner: Hashable, limit: int | None
    ) -> str:
        padded = ((size + 31) & -32) + PAD
        normal = (padded + self._align - 1) & -self._align
        granules = -(-padded // self._granule) * self._granule
        huge_wanted = mode == _HUGE_ONLY or (mode == _HUGE_FIRST and size > self._threshold)
        if mode == _HUGE_ONLY:
            reserve = f"{_fmt_bytes(granules)} reserved as {self._granule}-byte huge granules"
        elif huge_wanted:
            reserve = (
                f"{_fmt_bytes(granules)} reserved as {self._granule}-byte huge granules, "
                f"then {_fmt_bytes(normal)} as normal memory"
            )
        else:
            reserve = f"{_fmt_bytes(normal)} reserved as normal memory"
        used = self._by_owner.get(owner, 0)
        others = [n for who, n in self.usage_by_owner().items() if who != owner]
        smallest = granules if mode == _HUGE_ONLY else normal
        if limit is not None and used + smallest > limit:
            cause = (
                f"memory limit: {owner!r} may reserve {_fmt_bytes(limit)} and already holds "
                f"{_fmt_bytes(used)}; "
            )
        else:
            cause = ""
        return (
            f"out of device memory: asked {_fmt_bytes(size)} ({reserve}), "
            f"policy {policy_name(policy)}; "
            f"{cause}"
            f"free {_fmt_bytes(self._free_bytes)} of {_fmt_bytes(self._capacity)}, "
            f"largest free block {_fmt_bytes(self._largest())}, {len(self._free)} free blocks; "
            f"held by this client: {_fmt_bytes(used)}, by {len(others)} other client(s): "
            f"{_fmt_bytes(sum(others))}"
        )

    def top_users(self) -> str:
        """The owners that reserve the most, biggest first: who holds the memory, for the
        daemon's log (the out-of-memory message a client gets names no other owner)."""
        users = sorted(self.usage_by_owner().items(), key=lambda kv: kv[1], reverse=True)
        top = ", ".join(f"{who!r}: {_fmt_bytes(n)}" for who, n in users[:_TOP_USERS]) or "none"
        if len(users) > _TOP_USERS:
            top += f" and {len(users) - _TOP_USERS} more"
        return top

    def _bad_free_message(self, offset: int) -> str:
        if not 0 <= offset < self._capacity:
            return f"offset {offset:#x} is outside the device region [0, {self._capacity:#x})"
        inside = self._containing(offset)
        if inside is not None:
            return (
                f"offset {offset:#x} points inside the allocation at {inside.offset:#x} "
                f"({inside.reserved} bytes, owner {inside.owner!r}); "
                "aclrtFree takes the start address"
            )
        old = self._freed.get(offset)
        if old is not None:
            return (
                f"double free: the allocation at {offset:#x} ({old.size} bytes, owner "
                f"{old.owner!r}) was already freed"
            )
        return f"offset {offset:#x} is not the start of any allocation (it lies in free memory)"


def _as_ints(size: Any, policy: Any) -> tuple[int, int]:
    try:
        return operator.index(size), operator.index(policy)
    except TypeError as e:
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM, f"size and policy must be integers: {e}"
        ) from None
