"""What a kernel process may hold beyond its memory: threads and scratch files
(docs/security.md). A kernel is untrusted code, so it is counted from outside: its zygote
(server/units/zygote_main.py) looks at every kernel process every `WATCH_S` and kills one
over a bound; the daemon (server/units/kernel_processes.py) ends one that still has
threads once its batch is done -- nothing a kernel started outlives it.

A kernel process writes files only in its scratch folder (the sandbox's Landlock rules), each
at most `sandbox.Policy.file_size` (RLIMIT_FSIZE); their total is bounded here. Both
bounds are checked, not enforced by the kernel, so a kernel may overshoot one by what it
makes in one `WATCH_S` before it is killed.
"""

from __future__ import annotations

import os

MAX_THREADS = 64
"""Threads a kernel process may have while a kernel runs (one when it is idle)."""
SCRATCH_BYTES = 256 << 20
"""Bytes the files of a kernel process's scratch folder may hold, together."""
SCRATCH_ENTRIES = 4096
"""Files and folders its scratch folder may hold, together."""
WATCH_S = 0.05
"""How often the zygote looks at its kernel processes."""


def threads_of(pid: int) -> int:
    """How many threads process `pid` has now (0: it is gone). Blocks on nothing."""
    try:
        return os.stat(f"/proc/{pid}/task").st_nlink - 2  # its thread folder's own two
    except (FileNotFoundError, ProcessLookupError):
        return 0


def open_threads(pid: int) -> int:
    """A descriptor of process `pid`'s thread folder, for `threads_in` (the caller closes
    it). OSError if it is gone."""
    return os.open(f"/proc/{pid}/task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def threads_in(folder: int) -> int:
    """How many threads the process of `open_threads`' descriptor has now, as `threads_of`
    counts them (about 1 µs: the daemon asks after every batch)."""
    return os.fstat(folder).st_nlink - 2


def scratch_use(folder: str) -> tuple[int, int]:
    """(bytes allocated, entries) under `folder`, counted until either passes its bound."""
    allocated = entries = 0
    pending = [folder]
    while pending and allocated <= SCRATCH_BYTES and entries <= SCRATCH_ENTRIES:
        try:
            listing = os.scandir(pending.pop())
        except OSError:  # removed meanwhile
            continue
        with listing:
            for entry in listing:
                entries += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    else:
                        allocated += entry.stat(follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
    return allocated, entries


def breach(pid: int, scratch: str) -> str | None:
    """Why kernel process `pid` (scratch folder `scratch`) must end now, or None."""
    threads = threads_of(pid)
    if threads > MAX_THREADS:
        return f"started {threads} threads (at most {MAX_THREADS} run at once)"
    allocated, entries = scratch_use(scratch)
    if allocated > SCRATCH_BYTES:
        return f"wrote over {SCRATCH_BYTES >> 20} MiB in its scratch folder"
    if entries > SCRATCH_ENTRIES:
        return f"made over {SCRATCH_ENTRIES} files in its scratch folder"
    return None
