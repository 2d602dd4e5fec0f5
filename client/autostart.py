"""The embedded default: start a daemon when none answers at the per-user default address.

Only the default address (SIMNPU_ADDRESS unset) starts a daemon by itself, unless
SIMNPU_AUTOSTART=0; an address the user names starts one only with SIMNPU_AUTOSTART=1,
in a folder that exists. Several processes may find no daemon at once; an exclusive lock
file next to the socket makes exactly one of them start it while the others wait for it
to answer. The daemon it starts exits a little while (SIMNPU_IDLE_EXIT seconds, default 5)
after its last client. Its output goes to simnpu-daemon.log beside the lock, moved to
simnpu-daemon.log.1 when a start finds it over LOG_ROTATE_BYTES.

A Unix socket's folder is checked before anything is done there, a connection included
(simnpu.proto.socket_folder): the per-user default folder must be the user's alone, no
folder may be writable by every user without the sticky bit, and the lock and log files
are never opened through a symbolic link.

The daemon runs in "/" with `python -P`: neither it nor its worker processes (which
inherit the flag and the import path) import from the client's working directory, where
a folder named simnpu would hide the installed package.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import sys
import time

from simnpu.client import config
from simnpu.proto import codes, service, socket_folder
from simnpu.proto.errors import NpuError

START_TIMEOUT_S = 60.0
LOG_NAME = "simnpu-daemon.log"
LOG_ROTATE_BYTES = 10 << 20


def reachable(address: str) -> bool:
    """Whether something accepts connections at the gRPC address (cheap, no gRPC). NpuError
    (ACL_ERROR_RT_NO_DEVICE) if `address` is not an address, or its socket's folder is not
    safe (simnpu.proto.socket_folder)."""
    family, target = _socket_target(config.parse(address))
    if isinstance(target, str):
        try:
            with _unsafe_folder(address):
                socket_folder.check_folder(os.path.dirname(os.path.abspath(target)))
        except FileNotFoundError:
            return False
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
    with _unsafe_folder(address):
        if own_folder:
            socket_folder.make_folder(lock_dir)
        elif not os.path.isdir(lock_dir):
            raise NpuError(
                codes.ACL_ERROR_RT_NO_DEVICE,
                f"no simnpu daemon at {address}, and none is started there: its folder "
                f"{lock_dir} does not exist (create it, or correct the address)",
            )
        else:
            socket_folder.check_folder(lock_dir)
        lock = socket_folder.open_file(lock_dir, lock_name, os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not reachable(address):
            _start(address, lock_dir)
    finally:
        os.close(lock)


def _start(address: str, folder: str) -> None:
    """Start the daemon (holding the lock) and wait until it answers at `address`."""
    log_path = os.path.join(folder, LOG_NAME)
    with _unsafe_folder(address):
        log = _open_log(folder)
    try:
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
    finally:
        os.close(log)
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


def _open_log(folder: str) -> int:
    """The daemon's log file in `folder`, for appending; one over LOG_ROTATE_BYTES is first
    moved to its name + ".1" (replacing the previous one)."""
    log = socket_folder.open_file(folder, LOG_NAME, os.O_WRONLY | os.O_APPEND)
    if os.fstat(log).st_size <= LOG_ROTATE_BYTES:
        return log
    os.close(log)
    path = os.path.join(folder, LOG_NAME)
    os.replace(path, path + ".1")
    return socket_folder.open_file(folder, LOG_NAME, os.O_WRONLY | os.O_APPEND)


@contextlib.contextmanager
def _unsafe_folder(address: str):
    """Turn PermissionError (an unsafe socket folder or file) into the NpuError of no daemon
    (ACL_ERROR_RT_NO_DEVICE) naming `address`."""
    try:
        yield
    except PermissionError as error:
        raise NpuError(
            codes.ACL_ERROR_RT_NO_DEVICE, f"simnpu refuses the daemon address {address}: {error}"
        ) from None


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
