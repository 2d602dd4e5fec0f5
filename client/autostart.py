"""The embedded default: start a daemon at the configured address when none answers.

Several processes may find no daemon at once; an exclusive lock file next to the socket
makes exactly one of them start it while the others wait for it to answer. The daemon
it starts exits a little while (SIMNPU_IDLE_EXIT seconds, default 5) after its last client.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

START_TIMEOUT_S = 60.0


def reachable(address: str) -> bool:
    """Whether something accepts connections at the gRPC address (cheap, no gRPC)."""
    family, target = _socket_target(address)
    probe = socket.socket(family, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(target)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def ensure_daemon(address: str) -> None:
    """Start `python -m simnpu.server --listen address` unless a daemon answers there."""
    if os.environ.get("SIMNPU_AUTOSTART", "1") == "0":
        raise NpuError(
            codes.ACL_ERROR_RT_NO_DEVICE,
            f"no simnpu daemon at {address} (SIMNPU_AUTOSTART=0: start one with `simnpu serve`)",
        )
    family, target = _socket_target(address)
    if family != socket.AF_UNIX and target[0] not in ("127.0.0.1", "::1", "localhost"):
        raise NpuError(
            codes.ACL_ERROR_RT_NO_DEVICE, f"no simnpu daemon at {address} (not started: not local)"
        )
    lock_dir = os.path.dirname(target) if family == socket.AF_UNIX else f"/tmp/simnpu-{os.getuid()}"
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    lock_name = "simnpu.lock" if family == socket.AF_UNIX else f"tcp-{target[1]}.lock"
    with open(os.path.join(lock_dir, lock_name), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if reachable(address):
            return
        log_path = os.path.join(lock_dir, "simnpu-daemon.log")
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "simnpu.server",
                    "--listen",
                    address,
                    "--idle-exit",
                    os.environ.get("SIMNPU_IDLE_EXIT", "5"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not reachable(address):
            if process.poll() is not None:
                raise NpuError(
                    codes.ACL_ERROR_RT_NO_DEVICE,
                    f"the simnpu daemon started at {address} exited with code "
                    f"{process.returncode}; see {log_path}",
                )
            if time.monotonic() > deadline:
                raise NpuError(
                    codes.ACL_ERROR_RT_NO_DEVICE, f"the simnpu daemon at {address} did not come up"
                )
            time.sleep(0.02)


def _socket_target(address: str):
    if address.startswith("unix:"):
        return socket.AF_UNIX, address[len("unix://") :] if address.startswith(
            "unix://"
        ) else address[5:]
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return (socket.AF_INET6 if ":" in host else socket.AF_INET), (host, int(port))
