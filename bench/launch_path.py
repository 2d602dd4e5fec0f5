"""The files and functions one launch crosses: an empty kernel launched through `acl` and its
stream synchronized, traced in the client, the daemon and the daemon's workers.

    python bench/launch_path.py [--windows N] [--warm-up N] [--settle-ms MS] [--json PATH]

Starts its own daemon (bench/run.py's `Daemon`) with bench/call_recorder.py's profile hook
put in from outside: a `sitecustomize` in a temporary folder first on the daemon's
PYTHONPATH (it then runs the `sitecustomize` it hides, if there is one) installs the hook at
interpreter start, before any thread, in the daemon and in everything it starts -- workers
(multiprocessing spawn) and the kernel zygote inherit the environment, kernel processes the
hook itself at the fork. This process is the client: the hook is installed before its
first session. After a warm-up (the built-in `empty` function loaded, `--warm-up` launch +
synchronize pairs, so caches and lazy imports are done), each of `--windows` windows is one
`probes.launch_and_synchronize` (aclrtLaunchKernelWithHostArgs of `empty`, 1 block, no
arguments, then aclrtSynchronizeStream) and then `--settle-ms` more, so that what the
daemon and the worker do after the client has woken (the worker's report, the scheduler
taking it) is inside; between windows, untraced pairs bring the waits back to their steady
state. The window is opened and closed through a flag in shared memory (call_recorder.py).

What counts:
  * every Python call event in the window (C calls do not), and every frame on the stack
    it was made from (`f_back`), so the loops running before the window opened (the ring
    thread, the scheduler thread, the worker's loop) count too;
  * of those, the project's: code under the folders of the packages pyproject.toml lists
    (client/, server/, shm/, proto/, root_package/, client/acl, client/hccl in a checkout),
    named by path relative to the checkout. Generated code (a `co_filename` like
    "<string>") counts when its globals are a project module's -- the acl facade's
    functions, which client/facade.py compiles in its own namespace -- as one file per
    module, `<generated: simnpu.client.facade>`. Other generated code does not: a named
    tuple's `__new__` (its namespace is collections'), a spawned worker's `python -c`
    bootstrap (`__main__`), and the kernel launched (a kernel module is compiled from its
    source under its own name: it is what runs, not the path to it);
  * a function is (file, qualified name). A process counts by its role: `client`, `daemon`,
    and the others by their multiprocessing name without the device and index (the AI
    core's worker `simnpu-AI-core`, `... (forked)` for a kernel process); windows that ran
    on different AI cores count as one worker;
  * *the count* is what was seen in more than half of the windows, each file and function
    once however many processes cross it (ring and futex code, `proto/` on both sides).
    Printed beside it: the median count per window, the union over all windows, and what
    only a minority of windows saw (idle wake-ups: the client's stream reader, the
    daemon's main thread, a worker still starting).

docs/architecture.md's "17 files, 83 functions" (commit f2f60c2) also counted every
"<string>" code as the facade's file: run at that commit, these rules count 17 files and
81 functions -- the same files -- and those two more (a worker's bootstrap `<module>`, the
named tuple `Result`'s `<lambda>`) make 83.

The hook slows every call, so the traced waits are longer than a real launch's: the
client's synchronize outlasts its polling (POLL_S, 200 µs) and sleeps on the stream's
signal (`NotifyArea.wait_word`), which an untraced launch + synchronize does only when its
wait is long. Leaves no daemon, worker, shared-memory segment or scratch directory: it
stops the daemon, checks, and fails if anything is left.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import mmap
import os
import re
import signal
import statistics
import sys
import tempfile
import textwrap
import threading
import time
import tomllib
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import call_recorder  # noqa: E402

SITECUSTOMIZE = """\
# Written by bench/launch_path.py: trace this process, then run the sitecustomize this one hides.
import importlib.util
import os
import sys

_spec = importlib.util.spec_from_file_location("_launch_path_recorder", {recorder!r})
_recorder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_recorder)
_recorder.install({flag!r}, {out!r}, {folders!r}, {packages!r})

_mine, _path = sys.modules.pop("sitecustomize"), sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != {here!r}]
try:
    import sitecustomize  # noqa: F401
except ModuleNotFoundError as error:
    if error.name != "sitecustomize":
        raise
finally:
    sys.path[:] = _path
    sys.modules.setdefault("sitecustomize", _mine)
"""


def project_packages() -> tuple[list[str], list[str], str]:
    """The folders of the packages pyproject.toml installs (as this interpreter finds them),
    their top-level names, and the folder file names are given relative to."""
    with open(os.path.join(os.path.dirname(HERE), "pyproject.toml"), "rb") as handle:
        names = tomllib.load(handle)["tool"]["setuptools"]["packages"]
    found = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"package {name} is not installed")
        found += spec.submodule_search_locations
    real = {os.path.realpath(path) for path in found}
    folders = real | {os.path.abspath(path) for path in found}  # code names the path imported
    outermost = sorted(f for f in folders if not any(f.startswith(o + os.sep) for o in folders))
    tops = sorted({name.partition(".")[0] for name in names})
    return outermost, tops, os.path.commonpath(sorted(real))


def started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot), None if there is none: with the
    pid, it names one process even after the pid is used again."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, str | None]:
    """Every process below `pid` (whichever of its threads started it), with its start."""
    found: dict[int, str | None] = {}
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children") as handle:
                children = [int(child) for child in handle.read().split()]
        except OSError:
            continue
        for child in children:
            found[child] = started(child)
            found.update(descendants(child))
    return found


def stop_daemon(daemon, below: dict[int, str | None]) -> list[str]:
    """Stop the daemon (bench/run.py's SIGTERM); say what it left: its processes (killed
    here: they are this run's), shared-memory segments and scratch directories named by
    its pid."""
    daemon.close()
    pids = (daemon.process.pid, os.getpid())
    scratch = tempfile.gettempdir()

    def alive() -> list[int]:
        return [pid for pid, start in below.items() if start and started(pid) == start]

    def left() -> list[str]:
        found = [f"process {pid}" for pid in alive()]
        found += [
            f"/dev/shm/{name}"
            for name in os.listdir("/dev/shm")
            if any(name.startswith(f"simnpu-{pid}-") for pid in pids)
        ]
        return found + [
            os.path.join(scratch, name)
            for name in os.listdir(scratch)
            if name.startswith("simnpu-") and f"-{daemon.process.pid}-" in name
        ]

    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:  # kernel processes end after their zygote
        time.sleep(0.05)
    found = left()
    for pid in alive():
        os.kill(pid, signal.SIGKILL)
    return found


def trace(args, directory: str) -> tuple[dict, int]:
    """Run the windows; return the processes' records ({pid: process}) and the daemon's pid."""
    import run

    folders, packages, _ = project_packages()
    flag_path, out = os.path.join(directory, "window"), os.path.join(directory, "calls")
    hook_folder = os.path.join(directory, "site")
    os.mkdir(out)
    os.mkdir(hook_folder)
    with open(flag_path, "wb") as handle:
        handle.write(bytes(mmap.PAGESIZE))
    with open(os.path.join(hook_folder, "sitecustomize.py"), "w", encoding="utf-8") as handle:
        handle.write(
            SITECUSTOMIZE.format(
                recorder=os.path.abspath(call_recorder.__file__),
                flag=flag_path,
                out=out,
                folders=folders,
                packages=packages,
                here=hook_folder,
            )
        )
    path = os.pathsep.join(p for p in (hook_folder, os.environ.get("PYTHONPATH")) if p)
    call_recorder.install(flag_path, out, folders, packages)  # before this process's session
    daemon = run.Daemon(directory, "256MiB", env={"PYTHONPATH": path})
    os.environ.update(SIMNPU_ADDRESS=daemon.address, SIMNPU_AUTOSTART="0")
    below: dict[int, str | None] = {}
    try:
        import probes

        import acl

        with open(flag_path, "r+b") as handle:
            flag = mmap.mmap(handle.fileno(), 1)
        stream = probes.setup()
        empty = probes.builtin("empty")
        for _ in range(args.warm_up):
            probes.launch_and_synchronize(empty, stream)
        for window in range(1, args.windows + 1):
            for _ in range(20):  # the waits back to their steady state after a traced one
                probes.launch_and_synchronize(empty, stream)
            time.sleep(args.settle_ms / 1e3)
            flag[0] = window
            probes.launch_and_synchronize(empty, stream)
            time.sleep(args.settle_ms / 1e3)
            flag[0] = 0
        flag.close()
        below = descendants(daemon.process.pid)
        probes.check(acl.rt.destroy_stream(stream), "destroy_stream")
        probes.check(acl.rt.reset_device(0), "reset_device")
        probes.check(acl.finalize(), "finalize")
    finally:
        below = below or descendants(daemon.process.pid)
        sys.setprofile(None)  # this thread's; the others record nothing from now on
        threading.setprofile(None)
        left = stop_daemon(daemon, below)
        if left:
            raise SystemExit(f"the run left behind: {', '.join(left)}")
    return read_calls(out), daemon.process.pid


def read_calls(out: str) -> dict:
    """{pid: {"ppid", "forked", "name", "windows": {window: {(file, function)}}}} from the
    record files."""
    processes = {}
    for entry in sorted(os.listdir(out)):
        with open(os.path.join(out, entry), "rb") as handle:
            text = handle.read().split(b"\0", 1)[0].decode()
        lines = text.splitlines()
        if lines[-1:] == [call_recorder.FULL.decode().strip()]:
            raise SystemExit(f"process {entry} recorded more than {call_recorder.CAPACITY} bytes")
        _, pid, ppid, forked = lines[0].split("\t")
        process: dict = {"ppid": int(ppid), "forked": forked == "1", "name": "", "windows": {}}
        for line in lines[1:]:
            if line.startswith("name\t"):
                process["name"] = line.split("\t", 1)[1]
            elif line:
                window, filename, function = line.split("\t")
                process["windows"].setdefault(int(window), set()).add((filename, function))
        if process["windows"]:
            processes[int(pid)] = process
    return processes


def role(pid: int, process: dict, daemon_pid: int) -> str:
    if pid == os.getpid():
        return "client"
    if pid == daemon_pid:
        return "daemon"
    name = re.sub(r"-\d+(\.\d+)*$", "", process["name"])  # the device and unit index
    return f"{name} (forked)" if process["forked"] else name


def relative(filename: str, base: str) -> str:
    """A recorded file name as the table shows it: relative to the checkout."""
    if filename.startswith("<"):
        return filename
    return os.path.relpath(os.path.realpath(filename), base)


def tally(processes: dict, daemon_pid: int, windows: int) -> dict:
    """The count and its neighbours, by role and in total (see the module docstring)."""
    _, _, base = project_packages()
    seen: dict = defaultdict(lambda: defaultdict(set))  # role -> window -> functions
    for pid, process in processes.items():
        for window, functions in process["windows"].items():
            named = {(relative(f, base), q) for f, q in functions}
            seen[role(pid, process, daemon_pid)][window] |= named
    order = ["client", "daemon", *sorted(set(seen) - {"client", "daemon"})]
    roles, minority, counted = {}, {}, set()
    for name in (name for name in order if name in seen):
        times = Counter(f for functions in seen[name].values() for f in functions)
        kept = {f for f, n in times.items() if n * 2 > windows}
        counted |= kept
        if kept:  # (a process woken in a minority of the windows only is among the others)
            roles[name] = by_file(kept)
        others = [
            {"file": f, "function": q, "windows": times[f, q]} for f, q in sorted(set(times) - kept)
        ]
        if others:
            minority[name] = others
    each = [set().union(*(seen[name][w] for name in seen)) for w in range(1, windows + 1)]
    return {
        "windows": windows,
        "processes": roles,
        "count": totals(counted),
        "median_per_window": {
            "files": statistics.median(len({f for f, _ in functions}) for functions in each),
            "functions": statistics.median(len(functions) for functions in each),
        },
        "union": totals(set().union(*each)),
        "minority": minority,
    }


def by_file(functions: set) -> dict:
    """{file: [function, ...]}, both sorted."""
    files: dict = defaultdict(list)
    for filename, function in sorted(functions):
        files[filename].append(function)
    return dict(files)


def totals(functions: set) -> dict:
    return {"files": len({f for f, _ in functions}), "functions": len(functions)}


def report(result: dict) -> str:
    windows = result["windows"]
    lines = [f"seen in more than half of {windows} windows, by process:"]
    for name, files in result["processes"].items():
        count = sum(map(len, files.values()))
        lines.append(f"\n{name}: {len(files)} files, {count} functions")
        for filename, functions in files.items():
            text = f"{filename} ({len(functions)}): {', '.join(functions)}"
            lines += textwrap.wrap(text, 100, initial_indent="  ", subsequent_indent="      ")
    count, median, union = result["count"], result["median_per_window"], result["union"]
    lines += [
        "",
        f"the count (each file and function once): {count['files']} files, "
        f"{count['functions']} functions",
        f"per window, median: {median['files']:g} files, {median['functions']:g} functions",
        f"union of the {windows} windows: {union['files']} files, {union['functions']} functions",
    ]
    if result["minority"]:
        lines.append("\nseen in half of the windows or fewer (not counted):")
        for name, functions in result["minority"].items():
            lines += [
                f"  {name}: {f['file']} {f['function']} ({f['windows']} of {windows})"
                for f in functions
            ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--windows", type=int, default=20, metavar="N", help="1 to 255")
    parser.add_argument("--warm-up", type=int, default=300, metavar="N")
    parser.add_argument(
        "--settle-ms", type=float, default=20.0, help="traced after the synchronize returns"
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if not 1 <= args.windows <= 255:
        parser.error("--windows takes 1 to 255 (the window's number is one byte)")
    with tempfile.TemporaryDirectory(prefix="simnpu-launch-path-") as directory:
        processes, daemon_pid = trace(args, directory)
    result = tally(processes, daemon_pid, args.windows)
    print(report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
