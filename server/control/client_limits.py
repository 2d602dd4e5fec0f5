"""The daemon's limits on its clients: what one client may hold, so that it cannot take what
every client shares, and what all clients of a device may hold together.

    sessions        the daemon's (DaemonConfig.max_sessions) and one peer's
                    (--max-sessions-per-peer: one process, one remote host, or all Unix
                    clients without credentials together; server/control/credentials.py)
    streams         one client's on a device, its contexts' default streams too
                    (--max-streams-per-client), and the device's for all of its clients
                    (MAX_STREAMS_PER_DEVICE): 207008
    events          one client's on a device (--max-events-per-client), and the device's
                    (MAX_EVENTS_PER_DEVICE): 207007
    kernel modules  the source of one (--max-module-size): 100003, checked by the parse,
                    whose child process it also bounds (server/kernels/discovery.py)

A client's device memory has its own limit, which the client may lower (--memory-limit,
server/memory/quotas.py); notifies and count notifies are counted per device by their tables
(server/core/notifies.py, cnt_notifies.py).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

if TYPE_CHECKING:
    from simnpu.server.control.daemon_config import DaemonConfig
    from simnpu.server.core.objects import Context


class ClientLimits:
    """The limits of one daemon and its counts of streams and events per device (any
    thread)."""

    def __init__(self, config: DaemonConfig):
        self._config = config
        self.module_bytes = config.max_module_bytes  # a kernel module's source, at most
        self._lock = threading.Lock()
        self._streams = [0] * config.devices
        self._events = [0] * config.devices

    def session_refused(self, sessions: int, held: int, peer: str) -> str | None:
        """Why a new session of `peer`, which holds `held` of the daemon's `sessions`, is
        refused; None if it is not."""
        config = self._config
        if sessions >= config.max_sessions:
            return f"the daemon serves at most {config.max_sessions} sessions"
        if held >= config.max_sessions_per_peer:
            return (
                f"{peer} already holds {held} sessions, the most one client may "
                f"(--max-sessions-per-peer {config.max_sessions_per_peer})"
            )
        return None

    def add_stream(self, contexts: list[Context], device: int) -> None:
        """A client whose contexts are `contexts` makes a stream on `device`; 207008 past the
        client's or the device's limit."""
        held = sum(len(c.streams) for c in contexts if c.device == device)
        self._add(
            held,
            self._config.max_streams_per_client,
            "--max-streams-per-client",
            self._streams,
            device,
            codes.MAX_STREAMS_PER_DEVICE,
            codes.ACL_ERROR_RT_NO_STREAM_RESOURCE,
            "streams",
        )

    def streams_gone(self, device: int, count: int = 1) -> None:
        """`count` streams of `device` were destroyed (or their session ended)."""
        self._count(self._streams, device, -count, 0, 0, "")

    def add_event(self, contexts: list[Context], device: int) -> None:
        """A client whose contexts are `contexts` makes an event on `device`; 207007 past the
        client's or the device's limit."""
        held = sum(c.events for c in contexts if c.device == device)
        self._add(
            held,
            self._config.max_events_per_client,
            "--max-events-per-client",
            self._events,
            device,
            codes.MAX_EVENTS_PER_DEVICE,
            codes.ACL_ERROR_RT_NO_EVENT_RESOURCE,
            "events",
        )

    def events_gone(self, device: int, count: int = 1) -> None:
        """`count` events of `device` were destroyed (or their session ended)."""
        self._count(self._events, device, -count, 0, 0, "")

    def _add(
        self,
        held: int,
        limit: int,
        flag: str,
        counts: list[int],
        device: int,
        device_limit: int,
        code: int,
        what: str,
    ) -> None:
        """One more of `what` for a client that holds `held` on `device`: refused past the
        client's `limit` (the option `flag`) or the device's."""
        if held >= limit:
            raise NpuError(
                code,
                f"this client has {limit} {what} on device {device}, the most one client "
                f"may have (simnpu serve {flag}); the device has {device_limit} for all of "
                "its clients",
            )
        self._count(counts, device, +1, device_limit, code, what)

    def _count(
        self, counts: list[int], device: int, delta: int, limit: int, code: int, what: str
    ) -> None:
        with self._lock:
            if delta > 0 and counts[device] + delta > limit:
                raise NpuError(code, f"device {device} has all of its {limit} {what} in use")
            counts[device] += delta
