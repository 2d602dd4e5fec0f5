"""The advice and last prefetch location of one block of managed memory, per byte range
(aclrtMemManagedAdvise, aclrtMemManagedPrefetchAsync), and the range attributes they
answer (aclrtMemManagedGetAttr(s)).

Managed memory here is host pages that the device maps and never moves (a coherent
system), so advice changes nothing and a prefetch moves no bytes: both are recorded, and
the attributes report what was recorded, as the runtime documents them. Pure logic: the
raw layer (client/runtime/managed_memory.py) checks the arguments and keeps one `ManagedRanges`
per block.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from simnpu.proto import codes
from simnpu.proto.errors import invalid

Location = tuple[int, int]  # (aclrtMemManagedLocationType, id); the host's id is 0

# what an attribute reports for a location, or for none or a range that does not agree
HOST_ID = -1
INVALID_ID = -2
INT_SIZE = 4  # every attribute value is a 32-bit int (the location types too)


@dataclass(frozen=True)
class Advice:
    """What one byte range of a block was told and where it was last prefetched."""

    read_mostly: bool = False
    preferred: Location | None = None
    accessed_by: frozenset[Location] = field(default_factory=frozenset)
    last_prefetch: Location | None = None


def _id(location: Location | None) -> int:
    """PREFERRED_LOCATION / LAST_PREFETCH_LOCATION: a device or NUMA node id, -1 the host,
    -2 none or no agreement."""
    if location is None:
        return INVALID_ID
    return HOST_ID if location[0] == codes.ACL_MEM_LOCATIONTYPE_HOST else location[1]


def _type(location: Location | None) -> int:
    return codes.ACL_MEM_LOCATIONTYPE_INVALID if location is None else location[0]


def _location_id(location: Location | None) -> int:
    """*_LOCATION_ID: the id of a device or NUMA node; -2 otherwise."""
    if location is None or location[0] == codes.ACL_MEM_LOCATIONTYPE_HOST:
        return INVALID_ID
    return location[1]


class ManagedRanges:
    """Advice per byte range of a block of `size` bytes: sorted segment starts, each
    segment's `Advice` (neighbours always differ)."""

    def __init__(self, size: int):
        self.size = size
        self._starts = [0]
        self._values = [Advice()]

    def _split(self, offset: int) -> int:
        """The index of the segment that starts at `offset`, splitting one if needed."""
        index = bisect.bisect_right(self._starts, offset) - 1
        if self._starts[index] == offset:
            return index
        self._starts.insert(index + 1, offset)
        self._values.insert(index + 1, self._values[index])
        return index + 1

    def update(self, offset: int, length: int, change: Callable[[Advice], Advice]) -> None:
        """Apply `change` to the advice of every byte of `[offset, +length)`."""
        first = self._split(offset)
        end = self._split(offset + length) if offset + length < self.size else len(self._starts)
        for index in range(first, end):
            self._values[index] = change(self._values[index])
        starts, values = [self._starts[0]], [self._values[0]]
        for start, value in zip(self._starts[1:], self._values[1:], strict=True):
            if value != values[-1]:
                starts.append(start)
                values.append(value)
        self._starts, self._values = starts, values

    def advise(self, offset: int, length: int, advice: int, location: Location) -> None:
        """aclrtMemManagedAdvise of `[offset, +length)` (arguments already checked)."""
        changes: dict[int, Callable[[Advice], Advice]] = {
            codes.ACL_MEM_ADVISE_SET_READ_MOSTLY: lambda a: replace(a, read_mostly=True),
            codes.ACL_MEM_ADVISE_UNSET_READ_MOSTLY: lambda a: replace(a, read_mostly=False),
            codes.ACL_MEM_ADVISE_SET_PREFERRED_LOCATION: lambda a: replace(a, preferred=location),
            codes.ACL_MEM_ADVISE_UNSET_PREFERRED_LOCATION: lambda a: replace(a, preferred=None),
            codes.ACL_MEM_ADVISE_SET_ACCESSED_BY: lambda a: replace(
                a, accessed_by=a.accessed_by | {location}
            ),
            codes.ACL_MEM_ADVISE_UNSET_ACCESSED_BY: lambda a: replace(
                a, accessed_by=a.accessed_by - {location}
            ),
        }
        self.update(offset, length, changes[advice])

    def prefetched(self, offset: int, length: int, location: Location) -> None:
        """A prefetch of `[offset, +length)` to `location` ran (in its stream's order)."""
        self.update(offset, length, lambda a: replace(a, last_prefetch=location))

    def _over(self, offset: int, length: int) -> list[Advice]:
        first = bisect.bisect_right(self._starts, offset) - 1
        last = bisect.bisect_left(self._starts, offset + length)
        return self._values[first:last]

    def attribute(
        self, attribute: int, offset: int, length: int, data_size: int
    ) -> int | list[int]:
        """aclrtMemManagedGetAttr of `[offset, +length)`: an int, or for ACCESSED_BY a list
        of `data_size // 4` ids (-2 past the locations that advised the whole range).
        107000 for a data size the attribute does not take."""
        if attribute == codes.ACL_MEM_RANGE_ATTRIBUTE_ACCESSED_BY:
            if data_size <= 0 or data_size % INT_SIZE:
                raise invalid(f"dataSize {data_size}: ACCESSED_BY takes a non-zero multiple of 4")
        elif data_size != INT_SIZE:
            raise invalid(f"dataSize {data_size}: attribute {attribute} is a 4-byte value")
        values = self._over(offset, length)
        if attribute == codes.ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY:
            return int(all(value.read_mostly for value in values))
        if attribute == codes.ACL_MEM_RANGE_ATTRIBUTE_ACCESSED_BY:
            common = frozenset.intersection(*(value.accessed_by for value in values))
            ids = [_id(location) for location in sorted(common)]
            count = data_size // INT_SIZE
            return (ids + [INVALID_ID] * count)[:count]
        field_of, answer = _ANSWERS[attribute]
        locations = {getattr(value, field_of) for value in values}
        return answer(locations.pop() if len(locations) == 1 else None)


# the location attributes: (the Advice field they read, what they report of it)
_ANSWERS: dict[int, tuple[str, Callable[[Location | None], int]]] = {
    codes.ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION: ("preferred", _id),
    codes.ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE: ("preferred", _type),
    codes.ACL_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID: ("preferred", _location_id),
    codes.ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION: ("last_prefetch", _id),
    codes.ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE: ("last_prefetch", _type),
    codes.ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID: ("last_prefetch", _location_id),
}
