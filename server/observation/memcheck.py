"""Memory checking: what the daemon remembers about the device memory of checked sessions.

For every allocation a checked session makes (aclrtMalloc) the checker keeps a `Block`:
where, how big, whose, and the client call site of the malloc; the bytes written so far
(initcheck) and the recent accesses (race detection, server/observation/races.py). A freed block
leaves a `Tombstone` (the last TOMBSTONES frees) with the free's call site and the
host's vector clock at the free. Pinned host segments get a Block too, for races only.

What is found (each a finding, server/observation/findings.py):

- out-of-bounds: a kernel view past the end of its allocation, or outside every
  allocation (the kernel's MemoryFault, classified: past which allocation, by how much);
- use-after-free: a kernel given a freed pointer; a task submitted before a free, not
  ordered before it, that touches the freed bytes (whether it ran before or after the
  free: "freed while in use" is reported at the free, or when the task completes);
- cross-client access: a kernel touching another client's memory;
- initcheck: a copy source or a kernel's access="r" view covering bytes nothing wrote
  since the malloc (copies, memsets, collectives' receives and kernel writes count;
  "rw" views are not checked: they may read nothing);
- leaks: allocations still live when the client ends its session (or disconnects), and
  IPC imports it never closed (an exporter's block freed while still imported is kept for
  the importers by server/memory/ipc_memory.py: the exporter did free it, it is not its leak).

Only allocations made while checking was on are tracked; accesses outside them are not
checked. Everything runs under the scheduler lock.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import TYPE_CHECKING

from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner

TOMBSTONES = 4096


class Block:
    __slots__ = ("history", "key", "seq", "session", "site", "size", "space", "start", "written")

    def __init__(self, space, key, start, size, session, site, seq):
        self.space, self.key, self.start, self.size = space, key, start, size
        self.session, self.site, self.seq = session, site, seq
        self.written: list = []  # sorted disjoint [lo, hi) absolute ranges written so far
        self.history: list = []  # races.Access

    @property
    def end(self) -> int:
        return self.start + self.size

    def describe(self) -> str:
        if self.space == "seg":
            return f"pinned host memory {self.key} ({self.size} bytes)"
        owner = f", allocated at {self.site}" if self.site else ""
        return f"the {self.size}-byte allocation at {self.start:#x}{owner}"


class Tombstone:
    __slots__ = (
        "device",
        "free_clock",
        "free_seq",
        "free_site",
        "session",
        "site",
        "size",
        "start",
    )

    def __init__(self, block: Block, free_site: str, free_seq: int, free_clock: dict):
        self.device, self.start, self.size = block.key, block.start, block.size
        self.session, self.site = block.session, block.site
        self.free_site, self.free_seq, self.free_clock = free_site, free_seq, free_clock

    def describe(self) -> str:
        return (
            f"the {self.size}-byte allocation at {self.start:#x} (allocated at {self.site}, "
            f"freed at {self.free_site})"
        )


# ---- written-byte sets ------------------------------------------------------------------------
def add_range(ranges: list, lo: int, hi: int) -> None:
    """Merge [lo, hi) into the sorted disjoint list `ranges`."""
    i = bisect.bisect_left(ranges, (lo,)) - 1
    if i >= 0 and ranges[i][1] >= lo:
        lo = ranges[i][0]
    else:
        i += 1
    j = i
    while j < len(ranges) and ranges[j][0] <= hi:
        hi = max(hi, ranges[j][1])
        j += 1
    ranges[i:j] = [(lo, hi)]


def missing(ranges: list, lo: int, hi: int) -> list:
    """The parts of [lo, hi) that `ranges` does not cover."""
    gaps = []
    i = max(bisect.bisect_left(ranges, (lo,)) - 1, 0)
    at = lo
    while i < len(ranges) and ranges[i][0] < hi:
        a, b = ranges[i]
        if b > at:
            if a > at:
                gaps.append((at, a))
            at = max(at, b)
        i += 1
    if at < hi:
        gaps.append((at, hi))
    return gaps


class MemoryMap:
    """The Blocks of checked sessions, by device, and recent tombstones."""

    def __init__(self):
        self.starts: dict = {}  # device -> sorted starts
        self.blocks: dict = {}  # (device, start) -> Block
        self.segments: dict = {}  # pinned segment name -> Block
        self.tombstones: deque = deque(maxlen=TOMBSTONES)

    def allocated(
        self, device: int, address: int, size: int, session, site: str, seq: int
    ) -> Block:
        block = Block("dev", device, address, size, session, site, seq)
        starts = self.starts.setdefault(device, [])
        if (device, address) not in self.blocks:
            bisect.insort(starts, address)
        self.blocks[(device, address)] = block
        return block

    def freed(self, device: int, address: int) -> Block | None:
        block = self.blocks.pop((device, address), None)
        if block is not None:
            starts = self.starts[device]
            del starts[bisect.bisect_left(starts, address)]
        return block

    def find(self, device: int, address: int) -> Block | None:
        starts = self.starts.get(device)
        if not starts:
            return None
        i = bisect.bisect_right(starts, address) - 1
        if i < 0:
            return None
        block = self.blocks[(device, starts[i])]
        return block if address < block.end else None

    def nearest_below(self, device: int, address: int) -> Block | None:
        starts = self.starts.get(device)
        if not starts:
            return None
        i = bisect.bisect_right(starts, address) - 1
        return self.blocks[(device, starts[i])] if i >= 0 else None

    def segment(self, name: str, size: int) -> Block:
        block = self.segments.get(name)
        if block is None:
            block = self.segments[name] = Block("seg", name, 0, size, None, "", 0)
        return block

    def tombstone_of(
        self, session, device: int, lo: int, hi: int, after_seq: int = -1
    ) -> Tombstone | None:
        """The latest free by `session` of memory overlapping [lo, hi) on `device` that came
        after task `after_seq` (any free when -1)."""
        for tomb in reversed(self.tombstones):
            if (
                tomb.session is session
                and tomb.device == device
                and tomb.start < hi
                and lo < tomb.start + tomb.size
                and tomb.free_seq > after_seq
            ):
                return tomb
        return None

    def live_of(self, session) -> list[Block]:
        return sorted(
            (b for b in self.blocks.values() if b.session is session), key=lambda b: b.seq
        )

    def forget_session(self, session: Owner) -> None:
        """A session ended: its blocks go, and its accesses to other sessions' (shared) blocks."""
        for key in [k for k, b in self.blocks.items() if b.session is session]:
            self.freed(*key)
        for block in list(self.blocks.values()) + list(self.segments.values()):
            if any(access.session is session for access in block.history):
                block.history[:] = [a for a in block.history if a.session is not session]
        self.tombstones = deque(
            (t for t in self.tombstones if t.session is not session), maxlen=self.tombstones.maxlen
        )


def classify_fault(memory: MemoryMap, session, bounds, fault, devices=()) -> tuple[str, str]:
    """(finding kind, explanation) of a kernel's refused view (address, nbytes, access, block);
    `devices` (the daemon's) tell whose live allocation an address is in."""
    address, nbytes, _access, _block = fault
    if not isinstance(address, int) or address < (1 << 47):
        return "out-of-bounds", f"{address:#x} is not a device address (a host pointer, or garbage)"
    device, _ = split_device_address(address)
    for start, size in bounds:
        if start <= address < start + size:
            over = address + nbytes - start - size
            block = memory.find(device, start)
            where = (
                block.describe()
                if block is not None
                else f"the {size}-byte allocation at {start:#x}"
            )
            return (
                "out-of-bounds",
                (
                    f"the view of {nbytes} bytes at {address:#x} (offset {address - start}) runs "
                    f"{over} bytes past the end of {where}"
                ),
            )
    tomb = memory.tombstone_of(session, device, address, address + max(nbytes, 1))
    if tomb is not None and memory.find(device, address) is None:
        return "use-after-free", f"{address:#x} is inside {tomb.describe()}"
    live = devices[device].lookup(address) if device < len(devices) else None
    if live is not None and live.owner is not session:
        start = address - (split_device_address(address)[1] - live.offset)
        return (
            "cross-client access",
            (
                f"{address:#x} is inside the {live.size}-byte allocation at {start:#x} of "
                f"{live.owner!r}; a kernel may only touch its own client's memory (or memory "
                "imported with aclrtIpcMemImportByKey)"
            ),
        )
    block = memory.find(device, address)
    if block is not None:
        return (
            "out-of-bounds",
            (
                f"{address:#x} is inside {block.describe()}, which was not passed to this kernel "
                "as an argument "
                "(a kernel sees only the allocations its pointer arguments point into)"
            ),
        )
    below = memory.nearest_below(device, address)
    if below is not None and below.session is session:
        return (
            "out-of-bounds",
            f"{address:#x} is {address - below.end} bytes past the end of {below.describe()}",
        )
    return "out-of-bounds", f"{address:#x} is not inside any allocation of this client"
