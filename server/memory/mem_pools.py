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
requests are server/control/handlers/pools.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simnpu.proto import codes

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
