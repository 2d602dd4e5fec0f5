"""rt.managed: managed memory (aclrtMemAllocManaged, aclrtFree of managed memory) and its
advice, prefetches and range attributes (aclrtMemManagedAdvise, aclrtMemManagedPrefetchAsync,
aclrtMemManagedPrefetchBatchAsync, aclrtMemManagedGetAttr, aclrtMemManagedGetAttrs).

Managed memory is pinned memory of this process that the device maps (registered whole by
client/runtime/pinned_memory.py): its pages never move, as on a coherent system. Advice is
recorded per byte range (client/managed_ranges.py) in this process, which alone can name its
managed memory; a prefetch moves nothing but is a task of its stream, as in the runtime (a
host function): the last prefetch location changes when the stream reaches it. Checks and
codes follow the runtime's ACL, runtime and driver layers: ACL's own are 100000, the
runtime's and the driver's 107000.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.managed_ranges import Location, ManagedRanges
from simnpu.client.runtime.arguments import acl_param, check_allocatable
from simnpu.proto import codes
from simnpu.proto.errors import NotSupportedError, invalid

if TYPE_CHECKING:
    from simnpu.client.runtime.callbacks import HostCallbacks
    from simnpu.client.runtime.pinned_memory import PinnedMemory
    from simnpu.client.runtime.shared import Shared

_ADVICE = range(codes.ACL_MEM_ADVISE_SET_READ_MOSTLY, codes.ACL_MEM_ADVISE_UNSET_ACCESSED_BY + 1)
_ATTRIBUTES = range(
    codes.ACL_MEM_RANGE_ATTRIBUTE_READ_MOSTLY,
    codes.ACL_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID + 1,
)
# advice that names no location (the driver ignores it)
_NO_LOCATION = (
    codes.ACL_MEM_ADVISE_SET_READ_MOSTLY,
    codes.ACL_MEM_ADVISE_UNSET_PREFERRED_LOCATION,
)
HOST_NUMA_NODES = (0,)  # the simulated host is one NUMA node


def _location(value: Any) -> tuple[int, int]:
    """An aclrtMemManagedLocation given as a dict {"type", "id"} (absent: 0)."""
    if not isinstance(value, dict):
        raise acl_param(f"location must be a dict {{'type', 'id'}}, not {value!r}")
    kind, ident = value.get("type", 0), value.get("id", 0)
    if not isinstance(kind, int) or not isinstance(ident, int):
        raise acl_param(f"location type and id must be ints, not {value!r}")
    return kind, ident


class ManagedMemory:
    """Managed memory calls (see the module docstring)."""

    def __init__(self, shared: Shared, pinned: PinnedMemory, callbacks: HostCallbacks):
        self._contexts = shared.contexts
        self._pinned = pinned
        self._callbacks = callbacks
        self._lock = threading.Lock()
        self._advice: dict[
            int, ManagedRanges
        ] = {}  # managed block start -> its advice (once advised)

    # ---- allocating and freeing ----------------------------------------------------------------
    @records_errors
    def mem_alloc_managed(self, size: int, flag: int, site: str | None = None) -> int:
        """aclrtMemAllocManaged: `size` bytes usable at the pointer from this process and
        from kernels (pinned memory registered whole); freed with aclrtFree. Blocks."""
        if flag != codes.ACL_RT_MEM_ATTACH_GLOBAL:
            raise acl_param(f"flag {flag}: must be ACL_RT_MEM_ATTACH_GLOBAL (1)")
        if not isinstance(size, int) or size <= 0:
            raise invalid(f"cannot allocate {size!r} bytes of managed memory")
        check_allocatable(size, "managed memory")
        if not self._pinned.shared:
            raise NotSupportedError(
                "managed memory: this client has no shared memory with the daemon, so no "
                "device can reach its host memory"
            )
        ptr = self._pinned.malloc_host(size, site)
        try:
            self._pinned.register_managed(ptr, size, site)
        except BaseException:
            self._pinned.free_host(ptr, site)
            raise
        return ptr

    def free_managed(self, ptr: int, site: str | None) -> None:
        """aclrtFree of managed memory: its advice goes, it is unregistered and its pinned
        memory freed. Blocks."""
        with self._lock:
            self._advice.pop(ptr, None)
        self._pinned.release_managed(ptr, site)

    def _ranges(self, ptr: int, size: int) -> tuple[ManagedRanges, int]:
        """The records of the managed block `[ptr, +size)` lies in, and ptr's offset there;
        107000 when it is not all managed memory of this process (the driver's check)."""
        start, block = self._pinned.managed_block(ptr, size)
        with self._lock:
            ranges = self._advice.get(start)
            if ranges is None:
                ranges = self._advice[start] = ManagedRanges(block)
        return ranges, ptr - start

    def _device_id(self, location: tuple[int, int]) -> None:
        """The runtime's check of a device location: an id of a device that exists."""
        count = self._contexts.device_count
        if location[0] == codes.ACL_MEM_LOCATIONTYPE_DEVICE and not 0 <= location[1] < count:
            raise invalid(f"device {location[1]} does not exist (range [0, {count - 1}])")

    def _target(self, location: tuple[int, int], current_numa: bool) -> Location:
        """A location advice or a prefetch names, as recorded: a device, the host (id 0) or a
        NUMA node of the host; `current_numa`: HOST_NUMA_CURRENT is this thread's node (the
        prefetch calls resolve it). 107000 for any other."""
        kind, ident = location
        if kind == codes.ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT and current_numa:
            return codes.ACL_MEM_LOCATIONTYPE_HOST_NUMA, HOST_NUMA_NODES[0]
        if kind == codes.ACL_MEM_LOCATIONTYPE_DEVICE:
            return kind, ident
        if kind == codes.ACL_MEM_LOCATIONTYPE_HOST:
            return kind, 0
        if kind == codes.ACL_MEM_LOCATIONTYPE_HOST_NUMA:
            if ident not in HOST_NUMA_NODES:
                raise invalid(f"NUMA node {ident} does not exist (the host has node 0)")
            return kind, ident
        raise invalid(f"location type {kind} is not a device, the host or a host NUMA node")

    # ---- advice ---------------------------------------------------------------------------------
    @records_errors
    def mem_managed_advise(self, ptr: int, size: int, advice: int, location: Any) -> None:
        """aclrtMemManagedAdvise: record `advice` for `[ptr, +size)` of managed memory (the
        pages never move, so nothing else changes). Never waits."""
        if not ptr:
            raise acl_param("null pointer passed to mem_managed_advise")
        if size <= 0:
            raise acl_param(f"size {size} must be positive")
        place = _location(location)
        if advice not in _ADVICE:
            raise invalid(f"advise {advice} is out of range [0, 5]")
        self._device_id(place)
        self._contexts.current()  # the runtime needs a context (107002)
        if advice in _NO_LOCATION:
            target: Location = (codes.ACL_MEM_LOCATIONTYPE_INVALID, 0)
        elif (
            advice == codes.ACL_MEM_ADVISE_UNSET_READ_MOSTLY
            and place[0] == codes.ACL_MEM_LOCATIONTYPE_INVALID
        ):
            target = (codes.ACL_MEM_LOCATIONTYPE_HOST, 0)  # an invalid location is the host
        else:
            target = self._target(place, False)
        ranges, offset = self._ranges(ptr, size)
        with self._lock:
            ranges.advise(offset, size, advice, target)

    # ---- prefetches -----------------------------------------------------------------------------
    @records_errors
    def mem_managed_prefetch_async(
        self, ptr: int, size: int, location: Any, flags: int, stream: int, site: str | None = None
    ) -> None:
        """aclrtMemManagedPrefetchAsync (async): a task of `stream` that moves nothing (the
        pages are reachable from host and device) and records `location` as the range's
        last prefetch location when the stream reaches it."""
        if not ptr:
            raise acl_param("null pointer passed to mem_managed_prefetch_async")
        if size <= 0:
            raise acl_param(f"size {size} must be positive")
        if flags != 0:
            raise acl_param(f"flags {flags}: must be 0")
        place = _location(location)
        handle = self._contexts.stream(stream)
        self._device_id(place)
        target = self._target(place, True)
        ranges, offset = self._ranges(ptr, size)
        self._enqueue_prefetches([(ranges, offset, size, target)], handle, site)

    @records_errors
    def mem_managed_prefetch_batch_async(
        self,
        ptrs: Sequence[int],
        sizes: Sequence[int],
        count: int,
        locations: Sequence[Any],
        location_indexes: Sequence[int],
        num_locations: int,
        flags: int,
        stream: int,
        site: str | None = None,
    ) -> None:
        """aclrtMemManagedPrefetchBatchAsync (async): `count` prefetches as one task of
        `stream`; locations[k] applies to ptrs[location_indexes[k]] up to the next index."""
        if count <= 0 or num_locations <= 0:
            raise acl_param(f"count {count} and numPrefetchLocs {num_locations} must be positive")
        if len(ptrs) < count or len(sizes) < count:
            raise acl_param(f"ptrs and sizes must hold count ({count}) entries")
        if len(locations) < num_locations or len(location_indexes) < num_locations:
            raise acl_param(
                f"prefetchLocs and prefetchLocIdxs must hold numPrefetchLocs ({num_locations}) "
                "entries"
            )
        if flags != 0:
            raise acl_param(f"flags {flags}: must be 0")
        if count < num_locations:
            raise acl_param(f"count {count} must be at least numPrefetchLocs {num_locations}")
        indexes = list(location_indexes[:num_locations])
        if indexes[0] != 0:
            raise invalid(f"prefetchLocIdxs[0] is {indexes[0]}: it must be 0")
        if any(not ptr for ptr in ptrs[:count]):
            raise invalid("a null pointer in ptrs")
        for k, index in enumerate(indexes):
            if index >= count:
                raise invalid(f"prefetchLocIdxs[{k}] is {index}: it must be less than {count}")
            if k and index <= indexes[k - 1]:
                raise invalid(f"prefetchLocIdxs[{k}] is {index}: it must exceed the one before")
        places = [_location(location) for location in locations[:num_locations]]
        for place in places:
            self._device_id(place)
        handle = self._contexts.stream(stream)
        targets = [self._target(place, True) for place in places]
        work = []
        for k, target in enumerate(targets):
            end = indexes[k + 1] if k + 1 < num_locations else count
            for i in range(indexes[k], end):
                if sizes[i] <= 0:
                    raise invalid(f"sizes[{i}] is {sizes[i]}: it must be positive")
                ranges, offset = self._ranges(ptrs[i], sizes[i])
                work.append((ranges, offset, sizes[i], target))
        self._enqueue_prefetches(work, handle, site)

    def _enqueue_prefetches(
        self, work: list[tuple[ManagedRanges, int, int, Location]], stream: int, site: str | None
    ) -> None:
        def run(_data: object) -> None:
            with self._lock:
                live = {id(ranges) for ranges in self._advice.values()}
                for ranges, offset, size, target in work:
                    if id(ranges) in live:  # memory freed before the task ran: nothing to record
                        ranges.prefetched(offset, size, target)

        self._callbacks.launch_runtime_func(run, None, stream, site)

    # ---- range attributes -----------------------------------------------------------------------
    @records_errors
    def mem_managed_get_attr(self, attribute: int, ptr: int, size: int, data_size: int) -> Any:
        """aclrtMemManagedGetAttr: `attribute` of `[ptr, +size)` of managed memory, an int or
        (ACCESSED_BY) a list of `data_size // 4` ids; -2 (or type INVALID) where the range
        does not agree. Never waits."""
        if not ptr:
            raise acl_param("null pointer passed to mem_managed_get_attr")
        if size <= 0:
            raise acl_param(f"size {size} must be positive")
        return self._attributes([attribute], ptr, size, [data_size])[0]

    @records_errors
    def mem_managed_get_attrs(
        self, attributes: Sequence[int], ptr: int, size: int, data_sizes: Sequence[int]
    ) -> list[Any]:
        """aclrtMemManagedGetAttrs: each of `attributes` of `[ptr, +size)`, as get_attr.
        Never waits."""
        if not ptr:
            raise acl_param("null pointer passed to mem_managed_get_attrs")
        if size <= 0:
            raise acl_param(f"size {size} must be positive")
        if len(data_sizes) != len(attributes):
            raise acl_param("attributes and data_sizes must be lists of one length")
        return self._attributes(list(attributes), ptr, size, list(data_sizes))

    def _attributes(
        self, attributes: list[int], ptr: int, size: int, data_sizes: list[int]
    ) -> list[Any]:
        for attribute in attributes:
            if attribute not in _ATTRIBUTES:
                raise invalid(f"attribute {attribute} is out of range [1, 8]")
        if not attributes:
            raise invalid("no attribute to query")
        ranges, offset = self._ranges(ptr, size)
        with self._lock:
            return [
                ranges.attribute(attribute, offset, size, data_size)
                for attribute, data_size in zip(attributes, data_sizes, strict=True)
            ]
