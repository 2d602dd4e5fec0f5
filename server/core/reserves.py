"""The last of each finite resource, kept for processes that start (docs/security.md).

One process -- or several -- may take a device's memory, streams, events, notifies and count
notifies, and the daemon's sessions, until only a reserve is left; of the reserve, a process
may take only while it holds little (its *start share*, an eighth of the reserve), so another
process can always start, whatever the others hold, while one process alone still gets all
but the reserve. As CUDA MPS bounds each client, without a limit to configure per client:

    resource         reserve (simnpu serve --reserve KIND=N)   of
    memory           6.25% of each device's                    the device's memory
    sessions         8                                         the daemon's 64
    streams          64 per device                             1984 (MAX_STREAMS_PER_DEVICE)
    events           1024 per device                           65536 (MAX_EVENTS_PER_DEVICE)
    notifies         256 per device                            8192
    count notifies   256 per device                            8192

A request the reserve refuses gets the resource's own code (207001, 207005 -- the session
is refused --, 207008, 207007, 207009), with a message that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from simnpu.shm.sizes import parse_size

START_SHARE = 8  # a process may take from the reserve while it holds at most 1/8 of it


@dataclass(frozen=True)
class Reserve:
    """The last `kept` of a resource of `capacity`: past `capacity - kept` in use, a process
    may take more only while it holds at most `start` in all."""

    what: str  # what is counted, plural ("streams on device 0")
    kind: str  # its name for --reserve
    capacity: int
    kept: int

    @property
    def start(self) -> int:
        """What a process may hold and still take from the reserve."""
        return max(1, self.kept // START_SHARE) if self.kept else 0

    def refuses(self, held: int, in_use: int, more: int = 1) -> str | None:
        """Why a process holding `held` may not take `more` while `in_use` are taken by all
        (None: it may)."""
        if in_use + more <= self.capacity - self.kept or held + more <= self.start:
            return None
        return (
            f"the last {self.kept} of the {self.capacity} {self.what} are kept for other "
            f"processes to start, and this process holds {held} "
            f"(simnpu serve --reserve {self.kind}=N)"
        )

    def ceiling(self, held: int, in_use: int) -> int:
        """The most a process holding `held` may hold in all while `in_use` are taken."""
        if not self.kept:
            return self.capacity
        return max(held + self.capacity - self.kept - in_use, self.start)


@dataclass(frozen=True)
class Reserves:
    """What the daemon keeps of each resource (`simnpu serve --reserve`)."""

    memory_share: float = 1 / 16  # of each device's memory
    sessions: int = 8
    streams: int = 64
    events: int = 1024
    notifies: int = 256
    cnt_notifies: int = 256

    KINDS = ("memory", "sessions", "streams", "events", "notifies", "cnt_notifies")

    def memory(self, device: int, capacity: int) -> Reserve:
        """The reserve of device `device`'s memory, `capacity` bytes."""
        kept = int(capacity * self.memory_share) & -4096
        return Reserve(f"bytes of device {device}'s memory", "memory", capacity, kept)

    def of(self, kind: str, what: str, capacity: int) -> Reserve:
        """The reserve of `kind` (sessions, streams, events, notifies, cnt_notifies)."""
        return Reserve(what, kind, capacity, getattr(self, kind))


def parse_reserves(items: list[str], memory_bytes: int) -> Reserves:
    """`--reserve KIND=N` options -> Reserves (memory: a size, or a percentage of each
    device's `memory_bytes`). ValueError names a bad one."""
    chosen: dict[str, Any] = {}
    for item in items:
        kind, _, amount = item.partition("=")
        kind = kind.strip().replace("-", "_")
        if kind not in Reserves.KINDS or not amount.strip():
            raise ValueError(
                f"--reserve {item!r}: use KIND=N, KIND one of {', '.join(Reserves.KINDS)}"
            )
        amount = amount.strip()
        try:
            if kind != "memory":
                chosen[kind] = int(amount)
            elif amount.endswith("%"):
                chosen["memory_share"] = float(amount[:-1]) / 100
            else:
                chosen["memory_share"] = parse_size(amount) / memory_bytes
        except ValueError:
            raise ValueError(f"--reserve {item!r}: {amount!r} is not a number") from None
    return replace(Reserves(), **chosen)
