"""The profile hook bench/launch_path.py puts in every process it traces (standard library only:
it is loaded by a `sitecustomize` before anything else of the process).

`install()` sets the hook on the calling thread (`sys.setprofile`) and on every thread started
after it (`threading.setprofile`), so it must run before a process starts threads: at
interpreter start for the daemon and its workers, before the first session in the client.
The hook costs one flag test per event while no window is open. The driver opens window N by
writing N (1-255) into the first byte of a shared flag file and closes it by writing 0; the
flag is a shared mapping, so every process sees it at once.

While a window is open, each Python call event (C calls do not count) records the called
function and every function on its stack (`f_back`), so loops already running when the
window opened count too. Only the project's functions are written: code in a file under one
of `folders`, or generated code (`<string>` and the like) whose module belongs to one of
`packages` -- recorded under the file name `<generated: MODULE>`. Each is written once per
window and process, as `window<TAB>file<TAB>qualified name` lines into a file of its own in
`out_dir`: a shared mapping, so no system call on the path and nothing to flush (the lines
survive the process, however it ends). A process forked from a traced one gets a file of its
own at the fork, before the child may close its descriptors. The first line of a file names
its process: `#<TAB>pid<TAB>ppid<TAB>forked<TAB>` and, on the first record, `name<TAB>NAME`
(the multiprocessing name, known only once a spawned child has started); a file without
room for more ends with the line `full`.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time

CAPACITY = 8 << 20
"""Bytes of records a process may write (a sparse file: only what is written takes room)."""
FULL = b"full\n"
"""The last line of a file that had no room for more."""


def install(flag_path: str, out_dir: str, folders: list[str], packages: list[str]) -> None:
    """Trace this process from now on (and the threads it starts, and its forks)."""
    with open(flag_path, "rb") as handle:
        flag = mmap.mmap(handle.fileno(), 1, access=mmap.ACCESS_READ)
    prefixes = tuple(os.path.join(folder, "") for folder in folders)
    top_level = frozenset(packages)
    keys: dict = {}  # code object -> "file\tqualified name", or None when not the project's
    written: dict = {}  # code object -> the last window it was written in
    lock = threading.Lock()
    output: list = [None, 0, False]  # the mapping, the next offset, whether it is named yet

    def open_output(forked: bool) -> None:
        path = os.path.join(out_dir, f"{os.getpid()}-{time.monotonic_ns()}.calls")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, CAPACITY)
            mapping = mmap.mmap(fd, CAPACITY)
        finally:
            os.close(fd)  # the mapping stays
        header = f"#\t{os.getpid()}\t{os.getppid()}\t{int(forked)}\n".encode()
        mapping[: len(header)] = header
        output[:] = [mapping, len(header), False]

    def write(text: str) -> None:
        with lock:
            mapping, offset, named = output
            if not named:
                process = sys.modules.get("multiprocessing.process")
                name = process.current_process().name if process else "MainProcess"
                text = f"name\t{name}\n{text}"
                output[2] = True
            data = text.encode()
            if offset + len(data) > CAPACITY - len(FULL):  # (every write leaves room for FULL)
                if offset < CAPACITY:
                    mapping[offset : offset + len(FULL)] = FULL
                    output[1] = CAPACITY  # nothing more
                return
            mapping[offset : offset + len(data)] = data
            output[1] = offset + len(data)

    def key_of(frame) -> str | None:
        code = frame.f_code
        filename = code.co_filename
        if filename.startswith(prefixes):
            return f"{filename}\t{code.co_qualname}"
        if filename.startswith("<"):
            module = frame.f_globals.get("__name__")
            if isinstance(module, str) and module.partition(".")[0] in top_level:
                return f"<generated: {module}>\t{code.co_qualname}"
        return None

    def hook(frame, event, arg):
        if event != "call":
            return
        window = flag[0]
        if not window:
            return
        while frame is not None:
            code = frame.f_code
            if written.get(code) != window:
                written[code] = window
                key = keys.get(code, 0)
                if key == 0:
                    key = keys[code] = key_of(frame)
                if key is not None:
                    write(f"{window}\t{key}\n")
            frame = frame.f_back

    def after_fork() -> None:
        nonlocal lock
        lock = threading.Lock()  # another thread may have held it at the fork
        written.clear()
        open_output(forked=True)

    open_output(forked=False)
    os.register_at_fork(after_in_child=after_fork)
    threading.setprofile(hook)
    sys.setprofile(hook)
