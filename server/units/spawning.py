"""How the daemon starts its processes (workers, the kernel zygote, Gloo exchange processes):
with an environment made for them, at an entry point named, never imported, by the daemon.

The daemon runs no child's code: a spawn target is `entry_point("module:function")`, which
pickles as its name, so only the child imports the module that holds its `main`
(tests/server/test_process_boundaries.py).
"""

from __future__ import annotations

import os
import pkgutil
import sys
from typing import Any

from simnpu.server.core.unit_protocol import REDUCE_BLOCK_BYTES

NON_TEMPORAL_TUNABLE = "glibc.cpu.x86_non_temporal_threshold"


class _EntryPoint:
    """A child process's `main`, by name: called in the daemon it would have to be
    imported there, so it never is; it unpickles in the child as the function itself."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (pkgutil.resolve_name, (self.name,))


def entry_point(name: str) -> Any:
    """The spawn target of the function `name` ("package.module:function")."""
    return _EntryPoint(name)


def keep_working_directory_off_import_path() -> None:
    """Workers never import from the daemon's working directory, where a folder named simnpu
    would hide the installed package from every kernel: they start with PYTHONSAFEPATH=1
    (`python -P`) and take the daemon's sys.path, less the working directory that
    `python -m` put first."""
    os.environ["PYTHONSAFEPATH"] = "1"
    if not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]


def stream_large_copies() -> None:
    """Workers and kernel processes copy `REDUCE_BLOCK_BYTES` or more at a time with
    non-temporal stores (glibc's GLIBC_TUNABLES, read when a process starts; other C
    libraries ignore it): a store that bypasses the cache does not read the line it
    replaces first, which an ordinary store does, and a collective writes each byte to up to
    n destinations. glibc's own threshold is far larger. A threshold
    the daemon's environment already sets is kept."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if NON_TEMPORAL_TUNABLE not in tunables:
        threshold = f"{NON_TEMPORAL_TUNABLE}={REDUCE_BLOCK_BYTES:#x}"
        os.environ["GLIBC_TUNABLES"] = f"{tunables}:{threshold}" if tunables else threshold
