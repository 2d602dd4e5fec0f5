"""Stream-ordered allocation: aclrtMemPoolCreate / MallocAsync / FreeAsync (CANN's SOMA,
CUDA's cudaMallocAsync).

simnpu's pool is a view on the device allocator, not a cache in front of it: a block is
carved at MallocAsync (immediately: new memory has no pending users, so it is usable by
work queued on any stream after the call) and goes back to the device pool when the
stream of its FreeAsync reaches the free, i.e. once every task queued on that stream
before the free has run. Nothing is held back, so reserved == used and the release
threshold and reuse attributes are stored and reported but change nothing; TrimTo is
"reserved and not supported" in ACL itself (207000 from the client).

A pool belongs to the session that created it; blocks count against that client's memory
limit, and `max_size` (aclrtMemPoolProps.maxSize, 0 = unlimited) caps the pool itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, NpuMemoryError, invalid
from simnpu.server.objects import Waiter

POOL_HANDLE_KIND = 7

_SETTABLE = {
    codes.ACL_RT_MEM_POOL_REUSE_FOLLOW_EVENT_DEPENDENCIES: "reuse_follow_event_dependencies",
    codes.ACL_RT_MEM_POOL_REUSE_ALLOW_OPPORTUNISTIC: "reuse_allow_opportunistic",
    codes.ACL_RT_MEM_POOL_REUSE_ALLOW_INTERNAL_DEPENDENCIES: "reuse_allow_internal_dependencies",
    codes.ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD: "release_threshold",
}


@dataclass(eq=False)
class MemPool:
    device: int
    max_size: int
    handle: int = 0
    used: int = 0
    used_high: int = 0
    blocks: dict = field(default_factory=dict)  # address -> reserved bytes
    reuse_follow_event_dependencies: int = 1
    reuse_allow_opportunistic: int = 1
    reuse_allow_internal_dependencies: int = 1
    release_threshold: int = 0

    def describe(self) -> dict:
        return {"handle": self.handle, "used": self.used, "max_size": self.max_size}


class SessionPools:
    """A session's pools and their blocks (a mixin of SessionMemory's session)."""

    def _init_pools(self) -> None:
        self.pool_blocks: dict[int, MemPool] = {}  # address -> pool, until its FreeAsync

    def pool_of(self, address: int) -> dict | None:
        """The pool a block came from (for the snapshot), also while its FreeAsync waits."""
        pool = self.pool_blocks.get(address)
        if pool is not None:
            return pool.describe()
        for obj in list(self.handles.values()):
            if isinstance(obj, MemPool) and address in obj.blocks:
                return {**obj.describe(), "free_pending": True}
        return None

    def _pool(self, handle: int) -> MemPool:
        return self._get(handle, MemPool, "memory pool")

    def _mem_pool_create(self, request):
        """args (device, max_size) -> (pool,)."""
        device = self._device(request.args[0])
        max_size = request.args[1]
        if max_size < 0:
            raise invalid(f"a pool's maxSize cannot be negative ({max_size})")
        pool = MemPool(device.index, max_size)
        pool.handle = self._new_handle(pool, POOL_HANDLE_KIND)
        return [pool.handle]

    def _mem_pool_destroy(self, request):
        """args (pool,): blocks still allocated from it are freed now."""
        pool = self._pool(request.args[0])
        del self.handles[pool.handle]
        for address in list(pool.blocks):
            self._pool_release(pool, address)
        return []

    def _mem_pool_malloc(self, request):
        """args (pool, size, stream) -> (address,)."""
        pool = self._pool(request.args[0])
        size = request.args[1]
        self._stream(request.args[2])  # must be a stream of this session
        if size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size} bytes")
        device = self.daemon.devices[pool.device]
        address = device.allocate(size, codes.ACL_MEM_MALLOC_HUGE_FIRST, self,
                                  self.memory_limits.of(pool.device))
        reserved = device.lookup(address).reserved
        if pool.max_size and pool.used + reserved > pool.max_size:
            device.free(address)
            raise NpuMemoryError(f"memory pool {pool.handle:#x} is full: asked {size} bytes "
                                 f"({reserved} reserved), {pool.used} of its maxSize {pool.max_size} in use")
        pool.blocks[address] = reserved
        pool.used += reserved
        pool.used_high = max(pool.used_high, pool.used)
        self.pool_blocks[address] = pool
        self.allocations[address] = pool.device
        return [address]

    def _mem_pool_free(self, request):
        """args (address, stream): the block goes back when the stream reaches this point."""
        address = request.args[0]
        stream = self._stream(request.args[1])
        pool = self.pool_blocks.pop(address, None)
        if pool is None:
            raise invalid(f"{address:#x} was not allocated by aclrtMemPoolMallocAsync in this process "
                          "(or was freed already)")

        def begin():  # scheduler thread: after everything queued on the stream so far
            if not stream.tasks:
                self._pool_release(pool, address)
                return
            last = stream.tasks[-1].seq
            self.scheduler.watch(Waiter(lambda: stream.drained_upto(last),
                                        lambda timed_out: self._pool_release(pool, address)),
                                 streams=[stream])

        self._batch.append((begin, ()))
        return []

    def _pool_release(self, pool: MemPool, address: int) -> None:
        reserved = pool.blocks.pop(address, None)
        self.pool_blocks.pop(address, None)
        if reserved is None or self.allocations.pop(address, None) is None:
            return  # released already (pool destroyed, or the session ended first)
        pool.used -= reserved
        self.daemon.devices[pool.device].free(address)

    def _mem_pool_attr(self, request):
        """args (pool, attr, value): value -1 reads -> (value,)."""
        pool = self._pool(request.args[0])
        attr, value = request.args[1], request.args[2]
        read_only = {
            codes.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_CURRENT: pool.used,
            codes.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_HIGH: pool.used_high,
            codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT: pool.used,
            codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH: pool.used_high,
        }
        if value == -1:
            if attr in read_only:
                return [read_only[attr]]
            if attr in _SETTABLE:
                return [getattr(pool, _SETTABLE[attr])]
            raise invalid(f"unknown memory pool attribute {attr}")
        if attr in (codes.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_HIGH, codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH):
            if value != 0:
                raise invalid("a high-water attribute can only be reset to 0")
            pool.used_high = pool.used
            return [pool.used_high]
        if attr not in _SETTABLE or value < 0:
            raise invalid(f"memory pool attribute {attr} cannot be set to {value}")
        setattr(pool, _SETTABLE[attr], value)
        return [value]
