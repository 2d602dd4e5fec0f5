"""Daemon configuration: command-line flags, with environment variables as defaults."""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """'2GiB' -> 2147483648; plain numbers are bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 512MiB, 2GiB, 1048576)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


@dataclass
class DaemonConfig:
    listen: list
    devices: int = 1
    memory_bytes: int = 2 << 30
    ai_cores: int = 2
    copy_engines: int = 2
    staging_bytes: int = 32 << 20
    token: str | None = None
    idle_exit_s: float | None = None   # exit this long after the last session ends
    op_timeout_s: float = 300.0        # default operator execution timeout (aclrtSetOpExecuteTimeOut)
    max_sessions: int = 64
    memory_limit: int | None = None    # default per-client device-memory limit (server/quotas.py)
    trace_path: str | None = None      # --trace: the daemon's timeline, written at stop (observe.py)
    checks: int = 0                    # --check: simnpu.proto.observe bits for every client
    check_report: str | None = None    # --check-report: the daemon's findings, written at stop
    trace_buffer: int = 500_000        # --trace-buffer: timeline records kept (oldest dropped)

    def validate(self) -> None:
        if self.devices < 1:
            raise ValueError("--devices must be at least 1")
        if self.ai_cores < 1 or self.copy_engines < 1:
            raise ValueError("each device needs at least one AI core and one copy engine")
        if self.memory_bytes < 1 << 20:
            raise ValueError("--memory must be at least 1MiB")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ValueError("--memory-limit must be positive")
        if any(not is_unix(a) for a in self.listen) and not self.token:
            raise ValueError("a TCP listener needs a shared token: set SIMNPU_TOKEN or --token-file")


def is_unix(address: str) -> bool:
    return address.startswith("unix:")


def unix_path(address: str) -> str:
    """The file system path of a unix:// or unix: address."""
    return address[len("unix://"):] if address.startswith("unix://") else address[len("unix:"):]
