"""Daemon configuration: command-line flags, with environment variables as defaults."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from simnpu.proto import codes, service
from simnpu.server.core.cnt_notifies import MAX_CNT_NOTIFIES_PER_DEVICE
from simnpu.server.core.core_shares import SHARE_WINDOW_S
from simnpu.server.core.notifies import MAX_NOTIFIES_PER_DEVICE
from simnpu.server.core.reserves import Reserves
from simnpu.shm.addresses import MAX_MEMORY


@dataclass
class DaemonConfig:
    listen: list
    devices: int = 1
    memory_bytes: int = 2 << 30
    ai_cores: int = 2
    copy_engines: int = 2
    staging_bytes: int = 32 << 20
    token: str | None = None  # the operator's TCP token (a token file's first entry)
    tenants: tuple[tuple[str, str], ...] = ()  # (name, token) of the other TCP tenants
    idle_exit_s: float | None = None  # exit this long after the last session ends
    op_timeout_s: float = 300.0  # default operator execution timeout (aclrtSetOpExecuteTimeOut)
    core_share_window_s: float = SHARE_WINDOW_S  # --core-share-window-ms (core_shares.py)
    max_sessions: int = 64
    memory_limit: int | None = (
        None  # default per-client device-memory limit (server/memory/quotas.py)
    )
    trace_path: str | None = None  # --trace: the daemon's timeline, written at stop (observe.py)
    checks: int = 0  # --check: simnpu.proto.observe bits for every client
    check_report: str | None = None  # --check-report: the daemon's findings, written at stop
    trace_buffer: int = 500_000  # --trace-buffer: timeline records kept (oldest dropped)
    max_module_bytes: int = 1 << 20  # --max-module-size: a kernel module's source, at most
    max_streams_per_client: int = 1024  # --max-streams-per-client (per device, default ones too)
    max_events_per_client: int = 32768  # --max-events-per-client (per device)
    hello_timeout_s: float = 10.0  # --hello-timeout: a session silent this long is ended
    max_sessions_per_peer: int = 16  # --max-sessions-per-peer (server/control/credentials.py)
    advertise: str | None = None  # --advertise: this daemon's address for its peer daemons
    reserves: Reserves = field(default_factory=Reserves)  # --reserve (server/core/reserves.py)

    def validate(self) -> None:
        if self.devices < 1:
            raise ValueError("--devices must be at least 1")
        if self.ai_cores < 1 or self.copy_engines < 1:
            raise ValueError("each device needs at least one AI core and one copy engine")
        if not 0 <= self.core_share_window_s <= 60:
            raise ValueError("--core-share-window-ms must be from 0 to 60000")
        if not 1 << 20 <= self.memory_bytes <= MAX_MEMORY:
            raise ValueError(
                f"--memory must be from 1MiB to {MAX_MEMORY >> 30}GiB "
                "(half of a device's address space)"
            )
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ValueError("--memory-limit must be positive")
        if self.max_module_bytes < 1:
            raise ValueError("--max-module-size must be positive")
        if self.max_streams_per_client < 1 or self.max_events_per_client < 1:
            raise ValueError(
                "--max-streams-per-client and --max-events-per-client must be positive"
            )
        if self.hello_timeout_s <= 0:
            raise ValueError("--hello-timeout must be positive")
        if not 1 <= self.max_sessions_per_peer <= self.max_sessions:
            raise ValueError(
                f"--max-sessions-per-peer must be from 1 to {self.max_sessions} "
                "(the daemon's session limit)"
            )
        reserves = self.reserves
        for kind, kept, capacity in (
            ("sessions", reserves.sessions, self.max_sessions),
            ("streams", reserves.streams, codes.MAX_STREAMS_PER_DEVICE),
            ("events", reserves.events, codes.MAX_EVENTS_PER_DEVICE),
            ("notifies", reserves.notifies, MAX_NOTIFIES_PER_DEVICE),
            ("cnt_notifies", reserves.cnt_notifies, MAX_CNT_NOTIFIES_PER_DEVICE),
        ):
            if not 0 <= kept < capacity:
                raise ValueError(f"--reserve {kind}= must be from 0 to {capacity - 1}")
        if not 0 <= reserves.memory_share <= 0.5:
            raise ValueError("--reserve memory= must be at most half of a device's memory")
        tcp = any(service.parse_address(a).path is None for a in self.listen)
        if self.tenants and not self.token:
            raise ValueError("tenants' tokens need the operator's token first (docs/security.md)")
        if tcp and not self.token:
            raise ValueError(
                "a TCP listener needs a shared token: set SIMNPU_TOKEN or --token-file"
            )
        if self.advertise is not None:
            if not tcp:
                raise ValueError("--advertise needs a TCP listener (--listen HOST:PORT)")
            if service.parse_address(self.advertise).path is not None:
                raise ValueError("--advertise takes a TCP address, HOST:PORT")


def environment_listen() -> list[str]:
    """The daemon's addresses when no --listen is given: SIMNPU_LISTEN (comma-separated,
    e.g. in a container), else SIMNPU_ADDRESS (where its clients look), else the per-user
    Unix socket."""
    listen = [a.strip() for a in os.environ.get("SIMNPU_LISTEN", "").split(",") if a.strip()]
    return listen or [
        os.environ.get("SIMNPU_ADDRESS")
        or service.default_address(os.environ.get("XDG_RUNTIME_DIR"), os.getuid())
    ]


def token_file(flag: str | None) -> str | None:
    """The file holding the shared token: --token-file, else SIMNPU_TOKEN_FILE unless
    SIMNPU_TOKEN gives the token itself (the variables clients read too)."""
    return flag or (None if os.environ.get("SIMNPU_TOKEN") else os.environ.get("SIMNPU_TOKEN_FILE"))


def read_tokens(flag: str | None) -> list[tuple[str, str]]:
    """The (name, token) entries TCP clients may present (see token_file): the operator's
    first, then the tenants' (service.token_entries); empty if none is set. OSError if the
    file cannot be read, ValueError if it is malformed."""
    path = token_file(flag)
    if path:
        return service.read_token_entries(path)
    token = os.environ.get("SIMNPU_TOKEN")
    return [(service.OPERATOR_NAME, token)] if token else []


def default_advertise(listen: list[str]) -> str | None:
    """The address advertised when --advertise is not given: the first TCP listener's,
    with the host's name for a wildcard address."""
    for address in listen:
        parsed = service.parse_address(address)
        if parsed.path is None:
            host = parsed.host
            if host in ("0.0.0.0", "::", "[::]", ""):
                host = socket.gethostname()
            return f"{host}:{parsed.port}"
    return None
