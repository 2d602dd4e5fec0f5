"""Stream-ordered allocation: aclrtMemPoolCreate / MallocAsync / FreeAsync (CANN's SOMA,
CUDA's cudaMallocAsync).

simnpu's pool is a view on the device allocator, not a cache in front of it: a block is
carved at MallocAsync (immediately: new memory has no pending users, so it is usable by
work queued on any stream after the call) and goes back to the device pool when the
stream of its FreeAsync reaches the free, i.e. once every task queued on that stream
before the free has run. Nothing is held back, so reserved == used and the release
threshold and reuse attributes are stored and reported but change nothing, and TrimTo
has nothing to release.

A pool belongs to the session that created it; blocks count against that client's memory
limit, and `max_size` (aclrtMemPoolProps.maxSize, 0 = unlimited) caps the pool itself. The
requests are server/control/handlers/pool_calls.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, NpuMemoryError, invalid

if TYPE_CHECKING:
    from simnpu.server.memory.client_memory import ClientMemory
    from simnpu.server.memory.device_memory import DeviceWithMemory

SETTABLE = {
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

    def read_only(self) -> dict[int, int]:
        """The attributes only aclrtMemPoolGetAttr reads: used and reserved, now and at most."""
        return {
            codes.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_CURRENT: self.used,
            codes.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_HIGH: self.used_high,
            codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT: self.used,
            codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH: self.used_high,
        }

    def get_attr(self, attr: int) -> int:
        """aclrtMemPoolGetAttr."""
        read_only = self.read_only()
        if attr in read_only:
            return read_only[attr]
        if attr in SETTABLE:
            return getattr(self, SETTABLE[attr])
        raise invalid(f"unknown memory pool attribute {attr}")

    def set_attr(self, attr: int, value: int) -> int:
        """aclrtMemPoolSetAttr: the release threshold and reuse flags (stored: simnpu's pools
        do not cache), or a high-water attribute reset to 0; the attribute's value after."""
        if attr in (
            codes.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_HIGH,
            codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH,
        ):
            if value != 0:
                raise invalid("a high-water attribute can only be reset to 0")
            self.used_high = self.used
            return self.used_high
        if attr not in SETTABLE or value < 0:
            raise invalid(f"memory pool attribute {attr} cannot be set to {value}")
        setattr(self, SETTABLE[attr], value)
        return value


def create(memory: ClientMemory, device: int, max_size: int) -> MemPool:
    """aclrtMemPoolCreate: a pool of `memory`'s client on `device` (its handle is the
    caller's to give)."""
    if max_size < 0:
        raise invalid(f"a pool's maxSize cannot be negative ({max_size})")
    pool = MemPool(device, max_size)
    memory.pools.add(pool)
    return pool


def destroy(memory: ClientMemory, pool: MemPool, device: DeviceWithMemory) -> None:
    """aclrtMemPoolDestroy: blocks still allocated from the pool are freed now."""
    memory.pools.discard(pool)
    for address in list(pool.blocks):
        release(memory, pool, device, address)


def malloc_async(memory: ClientMemory, pool: MemPool, device: DeviceWithMemory, size: int) -> int:
    """aclrtMemPoolMallocAsync: a block carved at once (new memory has no pending users),
    counted against the client's limit and the pool's maxSize."""
    if size <= 0:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size} bytes")
    address = memory.allocate(device, size, codes.ACL_MEM_MALLOC_HUGE_FIRST)
    block = device.lookup(address)
    assert block is not None, "allocated just now"
    reserved = block.reserved
    if pool.max_size and pool.used + reserved > pool.max_size:
        del memory.allocations[address]
        device.free(address)
        raise NpuMemoryError(
            f"memory pool {pool.handle:#x} is full: asked {size} bytes "
            f"({reserved} reserved), {pool.used} of its maxSize {pool.max_size} in use"
        )
    pool.blocks[address] = reserved
    pool.used += reserved
    pool.used_high = max(pool.used_high, pool.used)
    memory.pool_blocks[address] = pool
    return address


def free_async(memory: ClientMemory, address: int) -> MemPool:
    """aclrtMemPoolFreeAsync of `address`: the pool it goes back to (`release`, when the
    stream reaches the free); 107000 for a block no MallocAsync of this client gave, or one
    freed already."""
    pool = memory.pool_blocks.pop(address, None)
    if pool is None:
        raise invalid(
            f"{address:#x} was not allocated by aclrtMemPoolMallocAsync in this process "
            "(or was freed already)"
        )
    return pool


def release(memory: ClientMemory, pool: MemPool, device: DeviceWithMemory, address: int) -> None:
    """A pool block goes back to the device (once; the pool or the session may have gone
    first)."""
    reserved = pool.blocks.pop(address, None)
    memory.pool_blocks.pop(address, None)
    if reserved is None or memory.allocations.pop(address, None) is None:
        return
    pool.used -= reserved
    device.free(address)


def check_trim(min_bytes_to_keep: int) -> None:
    """aclrtMemPoolTrimTo: a simnpu pool holds no unused memory (a freed block goes back to
    the device), so there is never anything to release; 107000 for a negative size."""
    if min_bytes_to_keep < 0:
        raise invalid(f"minBytesToKeep cannot be negative ({min_bytes_to_keep})")
