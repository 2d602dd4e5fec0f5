"""The allocator's free set: free blocks in exact best-fit order, binned by size.

A free block is one int key, `size << shift | start`, so key order is (size, start) order:
the smallest key >= `want << shift` is the smallest block that fits, lowest address on
ties. Keys live in size bins (TLSF's two-level mapping: the size's leading bit, then the
next `SUB_BITS` bits), each bin a sorted list, with an int bitmap of the non-empty bins.
Bins are ordered like the sizes they hold, so:

- `pop_ceil(k)`: bisect in k's own bin; if nothing there is >= k, the first key of the
  next non-empty bin (lowest set bit of the bitmap above it). Exact best fit, unlike
  TLSF's good-fit, which rounds the request up to the next bin.
- `add` / `remove`: one bisect in a short list plus a bitmap bit when a bin empties or
  fills.

Each operation is O(1) bin arithmetic plus a bisect and a list insert or delete within one
bin; a bin holds only blocks of sizes within 1/2**SUB_BITS of each other, so lists stay
short unless one size class dominates (then it degrades to one sorted list: a C memmove).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

SUB_BITS = 3
_SUB_MASK = (1 << SUB_BITS) - 1


def bin_of(size: int) -> int:
    """The bin of a block size (>= 2**SUB_BITS); monotone in size."""
    top = size.bit_length()
    return top << SUB_BITS | (size >> (top - 1 - SUB_BITS)) & _SUB_MASK


class FreeSet:
    __slots__ = ("bins", "count", "nonempty", "shift")

    def __init__(self, shift: int, keys=()):
        self.shift = shift
        self.bins: list[list[int]] = [[] for _ in range((shift + 2) << SUB_BITS)]
        self.nonempty = 0  # bit b set <=> bins[b] is not empty
        self.count = 0
        for key in keys:
            self.add(key)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        for b in self._bins_from(0):
            yield from self.bins[b]

    def add(self, key: int) -> None:
        size = key >> self.shift
        top = size.bit_length()
        b = top << SUB_BITS | (size >> (top - 1 - SUB_BITS)) & _SUB_MASK
        keys = self.bins[b]
        if keys:
            insort(keys, key)
        else:
            keys.append(key)
            self.nonempty |= 1 << b
        self.count += 1

    def remove(self, key: int) -> None:
        """Remove a key that is in the set (KeyError otherwise)."""
        size = key >> self.shift
        top = size.bit_length()
        b = top << SUB_BITS | (size >> (top - 1 - SUB_BITS)) & _SUB_MASK
        keys = self.bins[b]
        i = bisect_left(keys, key)
        if i == len(keys) or keys[i] != key:
            raise KeyError(key)
        del keys[i]
        if not keys:
            self.nonempty &= ~(1 << b)
        self.count -= 1

    def pop_ceil(self, key: int) -> int | None:
        """Remove and return the smallest key >= `key`, or None."""
        size = key >> self.shift
        top = size.bit_length()
        b = top << SUB_BITS | (size >> (top - 1 - SUB_BITS)) & _SUB_MASK
        if b >= len(self.bins):  # larger than any block can be
            return None
        keys = self.bins[b]
        i = bisect_left(keys, key) if keys else 0
        if i == len(keys):
            above = self.nonempty >> (b + 1)
            if not above:
                return None
            b += (above & -above).bit_length()
            keys = self.bins[b]
            i = 0
        found = keys.pop(i)
        if not keys:
            self.nonempty &= ~(1 << b)
        self.count -= 1
        return found

    def irange(self, key: int) -> Iterator[int]:
        """Keys >= `key` in ascending order (do not change the set while iterating)."""
        size = key >> self.shift
        size = max(size, 1 << SUB_BITS)
        first = bin_of(size)
        if first >= len(self.bins):
            return
        for b in self._bins_from(first):
            keys = self.bins[b]
            yield from (keys[bisect_left(keys, key) :] if b == first else keys)

    def last(self) -> int | None:
        """The largest key, or None."""
        if not self.nonempty:
            return None
        return self.bins[self.nonempty.bit_length() - 1][-1]

    def _bins_from(self, first: int) -> Iterator[int]:
        rest = self.nonempty >> first << first
        while rest:
            low = rest & -rest
            yield low.bit_length() - 1
            rest ^= low
