"""The folder of a daemon's Unix socket, which both sides trust (docs/security.md, "Local
users and the daemon's files"): who may own it, and how the files in it are opened.

Whoever can write to the folder can replace the socket (and receive the clients'
connections) or plant symbolic links where the lock and log files go. So:

- the per-user default folder (`$XDG_RUNTIME_DIR`, else `/tmp/simnpu-<uid>`) must be a
  real folder (not a symbolic link) owned by the user, writable by nobody else;
- any other folder must not be writable by every user unless it has the sticky bit
  (like /tmp, where nobody may rename or remove another user's files);
- the lock and log files are opened without following symbolic links and must be regular
  files of the user's own.

Violations raise PermissionError naming the folder or file, its owner and mode, and what
to do. No gRPC here: the client (autostart) and the daemon both use it.
"""

from __future__ import annotations

import os
import stat

from simnpu.proto import service

_OWNER_ONLY = 0o700


def is_default_folder(folder: str) -> bool:
    """Whether `folder` is a per-user default folder of this process's user: that of the
    default address, or /tmp/simnpu-<uid> (where autostart also keeps TCP addresses' locks)."""
    uid = os.getuid()
    defaults = (
        service.default_address(os.environ.get("XDG_RUNTIME_DIR"), uid),
        service.default_address(None, uid),
    )
    return os.path.abspath(folder) in {
        os.path.dirname(service.parse_address(address).path or "") for address in defaults
    }


def check_folder(folder: str) -> None:
    """PermissionError unless `folder` is safe for a socket (the rules above; the per-user
    default folder is recognised by its path). FileNotFoundError if it does not exist."""
    private = is_default_folder(folder)
    problem, info = _problem(folder, private)
    if not problem:
        return
    advice = (
        f"remove it (rm -r {folder}) and let simnpu create it again (mode 0700), or set "
        "SIMNPU_ADDRESS (or XDG_RUNTIME_DIR) to a folder only you can write"
        if private
        else "make it writable only by its owner (chmod 0700, or add the sticky bit: "
        "chmod +t), or choose another folder"
    )
    raise PermissionError(
        f"the simnpu socket folder {folder} {problem} (owner uid {info.st_uid}, mode "
        f"{stat.S_IMODE(info.st_mode):04o}; this user is uid {os.geteuid()}): another "
        f"user could replace the daemon's socket or plant links there; {advice}"
    )


def _problem(folder: str, private: bool) -> tuple[str, os.stat_result]:
    """What makes `folder` unsafe ("" if nothing), and what it is."""
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        if private:
            return "is a symbolic link", info
        info = os.stat(folder)  # a link the user chose: the folder it leads to counts
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder", info
    if private and info.st_uid != os.geteuid():
        return "is not owned by this user", info
    if private and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "is writable by other users", info
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        return "is writable by every user (and has no sticky bit)", info
    return "", info


def make_folder(folder: str) -> None:
    """Create the socket folder (and its parents) owner-only if it is missing, then check it
    (check_folder)."""
    os.makedirs(folder, mode=_OWNER_ONLY, exist_ok=True)
    check_folder(folder)


def open_file(folder: str, name: str, flags: int) -> int:
    """A descriptor of the file `name` in the checked `folder`, created (mode 0600) if
    missing, never through a symbolic link; PermissionError naming it if it is a link, not a
    regular file, or not this user's."""
    path = os.path.join(folder, name)
    try:
        descriptor = os.open(
            path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600
        )
    except OSError as error:
        if os.path.islink(path):
            raise PermissionError(
                f"{path} is a symbolic link (to {os.readlink(path)}): simnpu does not follow "
                "links in its socket folder; remove it"
            ) from None
        raise error
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(descriptor)
        raise PermissionError(
            f"{path} is not a regular file of this user (owner uid {info.st_uid}, mode "
            f"{info.st_mode:o}; this user is uid {os.geteuid()}): remove it"
        )
    os.set_blocking(descriptor, True)
    return descriptor
