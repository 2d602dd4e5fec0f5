"""How the daemon starts its processes (workers, the kernel zygote, Gloo exchange processes):
with an environment made for them, at an entry point named, never imported, by the daemon.

The daemon runs no child's code: a spawn target is `entry_point("module:function")`, which
pickles as its name, or a module run as a program (`python -P -m module`), so only the child
imports the module that holds its `main` (tests/server/test_process_boundaries.py).
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


def clean_environment() -> dict[str, str]:
    """The whole environment of a process whose children run clients' code (the kernel
    zygote): the daemon's import path, its copy tuning and one thread per BLAS or OpenMP
    pool, nothing else -- none of the daemon's variables (SIMNPU_TOKEN, an autostarting
    client's environment) reach a kernel, not even in the process's initial stack, which
    the kernel can read (docs/security.md)."""
    environment = {
        "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
        "PYTHONSAFEPATH": "1",
        "OMP_NUM_THREADS": "1",  # a kernel process is one AI core
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    if "GLIBC_TUNABLES" in os.environ:  # set by stream_large_copies
        environment["GLIBC_TUNABLES"] = os.environ["GLIBC_TUNABLES"]
    return environment


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
