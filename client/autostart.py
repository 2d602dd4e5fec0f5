"""The embedded default: start a daemon when none answers at the per-user default address.

Only the default address (SIMNPU_ADDRESS unset) starts a daemon by itself, unless
SIMNPU_AUTOSTART=0; an address the user names starts one only with SIMNPU_AUTOSTART=1,
in a folder that exists. Several processes may find no daemon at once; an exclusive lock
file next to the socket makes exactly one of them start it while the others wait for it
to answer. The daemon it starts exits a little while (SIMNPU_IDLE_EXIT seconds, default 5)
after its last client.

The daemon runs in "/" with `python -P`: neither it nor its worker processes (which
inherit the flag and the import path) import from the client's working directory, where
a folder named simnpu would hide the installed package.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time

from simnpu.client import config
from simnpu.proto import codes, service
from simnpu.proto.errors import NpuError

START_TIMEOUT_S = 60.0


def reachable(address: str) -> bool:
    """Whether something accepts connections at the gRPC address (cheap, no gRPC). NpuError
    (ACL_ERROR_RT_NO_DEVICE) if `address` is not an address."""
    family, target = _socket_target(config.parse(address))
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
    """Start `python -P -m simnpu.server --listen address` unless a daemon answers there, if
    autostart applies to `address` (see the module); blocks until it answers. NpuError
    (ACL_ERROR_RT_NO_DEVICE) if no daemon answers and none may or can be started."""
    parts = config.parse(address)
    default = address == config.default_address()
    _check_allowed(address, default, parts.path is not None)
    _, target = _socket_target(parts)
    if isinstance(target, str):  # a Unix socket: the lock and the log go next to it
        target = os.path.abspath(target)  # the daemon runs in "/"
        address = f"unix://{target}"
        lock_dir, lock_name = os.path.dirname(target), "simnpu.lock"
        own_folder = default  # the per-user folder is made if missing, a named one is not
    elif target[0] in ("127.0.0.1", "::1", "localhost"):
        lock_dir, lock_name = f"/tmp/simnpu-{os.getuid()}", f"tcp-{target[1]}.lock"
        own_folder = True
    else:
        raise NpuError(
            codes.ACL_ERROR_RT_NO_DEVICE, f"no simnpu daemon at {address} (not started: not local)"
        )
    if own_folder:
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    elif not os.path.isdir(lock_dir):
        raise NpuError(
            codes.ACL_ERROR_RT_NO_DEVICE,
            f"no simnpu daemon at {address}, and none is started there: its folder {lock_dir} "
            "does not exist (create it, or correct the address)",
        )
    with open(os.path.join(lock_dir, lock_name), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if reachable(address):
            return
        log_path = os.path.join(lock_dir, "simnpu-daemon.log")
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-P",  # the import path without the working directory, for its workers too
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
                cwd="/",
                env=_daemon_environment(),
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


def _check_allowed(address: str, default: bool, unix: bool) -> None:
    """NpuError unless autostart applies to `address`: SIMNPU_AUTOSTART=1, or the default
    address without SIMNPU_AUTOSTART=0."""
    setting = os.environ.get("SIMNPU_AUTOSTART", "")
    if setting not in ("", "0", "1"):
        raise NpuError(
            codes.ACL_ERROR_RT_NO_DEVICE,
            f"SIMNPU_AUTOSTART={setting!r}: 1 starts a daemon at any local address, "
            "0 at none, unset only at the per-user default address",
        )
    listen = "" if default else f" --listen {address}"
    if setting == "0":
        raise NpuError(
            codes.ACL_ERROR_RT_NO_DEVICE,
            f"no simnpu daemon at {address} (SIMNPU_AUTOSTART=0: start one with "
            f"`simnpu serve{listen}`)",
        )
    if setting == "" and listen:
        raise NpuError(
            codes.ACL_ERROR_RT_NO_DEVICE,
            f"no simnpu daemon at {address}: start one with `simnpu serve{listen}`"
            + (
                ", or set SIMNPU_AUTOSTART=1 to have the first client start one there"
                if unix
                else ""
            )
            + " (a daemon is started by itself only at the per-user default address, "
            "with SIMNPU_ADDRESS unset)",
        )


def _daemon_environment() -> dict[str, str]:
    """The client's environment for the daemon, a token file named relative to the client's
    working directory made absolute (the daemon runs in "/")."""
    environment = dict(os.environ)
    token_file = environment.get("SIMNPU_TOKEN_FILE")
    if token_file:
        environment["SIMNPU_TOKEN_FILE"] = os.path.abspath(token_file)
    return environment


def _socket_target(parts: service.Address) -> tuple[socket.AddressFamily, str | tuple[str, int]]:
    """The socket family and connect() target of a parsed address."""
    if parts.path is not None:
        return socket.AF_UNIX, parts.path
    host = parts.host or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return (socket.AF_INET6 if ":" in host else socket.AF_INET), (host, parts.port)
