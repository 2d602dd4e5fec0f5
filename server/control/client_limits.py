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

Of sessions, streams and events -- as of device memory, notifies and count notifies, which
their own modules count -- the last few are kept for processes that start
(server/core/reserves.py, --reserve). A client's device memory has its own limit too, which
the client may lower (--memory-limit, server/memory/quotas.py).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

if TYPE_CHECKING:
    from simnpu.server.control.daemon_config import DaemonConfig
    from simnpu.server.core.reserves import Reserve
    from simnpu.server.core.streams import Context


class _Counted:
    """One kind of object the daemon counts per device: what one client may hold of it (and
    the option that says so), what a device has for all of its clients, the code past
    either, and the count of each device (under ClientLimits' lock)."""

    def __init__(
        self, what: str, limit: int, flag: str, per_device: int, code: int, reserves: list[Reserve]
    ):
        self.what = what
        self.limit = limit
        self.flag = flag
        self.per_device = per_device
        self.code = code
        self.reserves = reserves  # of each device
        self.counts = [0] * len(reserves)


class ClientLimits:
    """The limits of one daemon and its counts of streams and events per device (any
    thread)."""

    def __init__(self, config: DaemonConfig):
        self._config = config
        self.module_bytes = config.max_module_bytes  # a kernel module's source, at most
        self._lock = threading.Lock()
        reserves = config.reserves
        self._sessions = reserves.of("sessions", "sessions of the daemon", config.max_sessions)
        self._streams = _Counted(
            "streams",
            config.max_streams_per_client,
            "--max-streams-per-client",
            codes.MAX_STREAMS_PER_DEVICE,
            codes.ACL_ERROR_RT_NO_STREAM_RESOURCE,
            [
                reserves.of("streams", f"streams of device {d}", codes.MAX_STREAMS_PER_DEVICE)
                for d in range(config.devices)
            ],
        )
        self._events = _Counted(
            "events",
            config.max_events_per_client,
            "--max-events-per-client",
            codes.MAX_EVENTS_PER_DEVICE,
            codes.ACL_ERROR_RT_NO_EVENT_RESOURCE,
            [
                reserves.of("events", f"events of device {d}", codes.MAX_EVENTS_PER_DEVICE)
                for d in range(config.devices)
            ],
        )

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
        return self._sessions.refuses(held, sessions)

    def add_stream(self, contexts: list[Context], device: int) -> None:
        """A client whose contexts are `contexts` makes a stream on `device`; 207008 past the
        client's or the device's limit."""
        self._add(
            self._streams, sum(len(c.streams) for c in contexts if c.device == device), device
        )

    def streams_gone(self, device: int, count: int = 1) -> None:
        """`count` streams of `device` were destroyed (or their session ended)."""
        with self._lock:
            self._streams.counts[device] -= count

    def add_event(self, contexts: list[Context], device: int) -> None:
        """A client whose contexts are `contexts` makes an event on `device`; 207007 past the
        client's or the device's limit."""
        self._add(self._events, sum(c.events for c in contexts if c.device == device), device)

    def events_gone(self, device: int, count: int = 1) -> None:
        """`count` events of `device` were destroyed (or their session ended)."""
        with self._lock:
            self._events.counts[device] -= count

    def _add(self, kind: _Counted, held: int, device: int) -> None:
        """One more of `kind` on `device` for a client that holds `held` there: refused past
        the client's limit or the device's."""
        if held >= kind.limit:
            raise NpuError(
                kind.code,
                f"this client has {kind.limit} {kind.what} on device {device}, the most one "
                f"client may have (simnpu serve {kind.flag}); the device has "
                f"{kind.per_device} for all of its clients",
            )
        with self._lock:
            if kind.counts[device] + 1 > kind.per_device:
                raise NpuError(
                    kind.code,
                    f"device {device} has all of its {kind.per_device} {kind.what} in use",
                )
            refused = kind.reserves[device].refuses(held, kind.counts[device])
            if refused is not None:
                raise NpuError(kind.code, refused)
            kind.counts[device] += 1
