"""The client's end of a session's fast path (docs/fast-path.md): its notify area (the
streams' completion signals and the replies' mailbox slots) and its submission ring, mapped
here when this process shares the daemon's /dev/shm, and how long a wait on either polls
before it sleeps. A synchronize decided on the signals is client/runtime/synchronization.py's;
a reply's mailbox wait is client/replies.py's.
"""

from __future__ import annotations

from simnpu.shm import futex
from simnpu.shm.notify import NotifyArea
from simnpu.shm.region import Region
from simnpu.shm.ring import SubmissionRing

SLICE_S = 0.1  # how often a sleeping synchronize re-checks that the session is alive
POLL_S = 200e-6
"""How long a synchronize polls its signal before it sleeps on it, as the real runtime
queries a stream's task status a few times before it waits for the device's interrupt:
about two of this device's shortest round trips (a launch + synchronize of an empty
kernel, ~100 µs), so a wait on short work ends without a futex sleep and a wake-up. A
stream whose last wait took longer than this sleeps at once: its work is not short, and
polling would only take CPU from the units running it."""
FAST_SYNC_POLL_S = 0.02
"""How long a synchronize polls on a stream created with ACL_STREAM_FAST_SYNC, which asks
aclrtSynchronizeStream to poll the task status rather than wait for a notification (the
real runtime: up to 200,000 queries): lower latency for work up to this long, paid in CPU."""


class FastPath:
    """The mapped segments of a session's fast path, in use by its connection."""

    def __init__(self, connection, notify_region: Region, ring_region: Region | None):
        self.connection = connection
        self.notify_region = notify_region
        self.ring_region = ring_region
        self.area = NotifyArea(notify_region.map)  # the streams' signals, the mailbox slots
        connection.use_notify(self.area)
        if ring_region is not None:
            connection.use_ring(SubmissionRing(ring_region.map))

    def close(self) -> None:
        """Unmap (after the connection closed)."""
        if self.ring_region is not None:
            self.connection.ring.release()
            self.ring_region.close()
        self.connection.mailbox.area.release()
        self.notify_region.close()


def attach(connection, notify_name: str, ring_name: str) -> FastPath | None:
    """Map the session's notify area and submission ring and have `connection` use them
    (the caller made sure, with the staging probe, that this process shares the daemon's
    /dev/shm); None where futexes are not available or the daemon made none. Blocks."""
    notify_region = _map(notify_name)
    if notify_region is None:
        return None
    return FastPath(connection, notify_region, _map(ring_name, populate=True))


def _map(name: str, populate: bool = False) -> Region | None:
    if not name or not futex.AVAILABLE:
        return None
    try:
        return Region.attach(name, populate=populate)
    except Exception:
        return None
