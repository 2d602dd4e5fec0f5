"""server/units/sandbox.py: a process in the sandbox keeps numpy, threads and its scratch folder,
and loses everything a hostile kernel used (docs/kernel-isolation.md). Each case runs in a
fresh process, since entering the sandbox cannot be undone."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from simnpu.server.units import sandbox

PROBE = """
import ctypes, errno, json, mmap, os, resource, socket, subprocess, sys, threading
import numpy as np
from simnpu.server.units import sandbox

parent, scratch, secret, victim = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
package = os.path.dirname(os.path.dirname(sandbox.__file__))
state = sandbox.enter(
    sandbox.Policy(
        readable=(sys.prefix, sys.base_prefix, package), scratch=scratch, parent=parent,
        address_space=4 << 30,
    )
)
out = {"landlock": state.landlock_abi, "seccomp": state.seccomp, "missing": state.missing}


def attempt(name, action):
    try:
        action()
        out[name] = "allowed"
    except OSError as error:
        out[name] = errno.errorcode.get(error.errno, str(error.errno))
    except MemoryError:
        out[name] = "MemoryError"


attempt("read a file outside", lambda: open(secret).read())
attempt("read the parent's command line", lambda: open(f"/proc/{parent}/cmdline").read())
attempt("list /dev/shm", lambda: os.listdir("/dev/shm"))
attempt("write in scratch", lambda: open(os.path.join(scratch, "out"), "w").write("ok"))
attempt("write outside", lambda: open(os.path.join(os.path.dirname(secret), "x"), "w"))
attempt("open a socket", lambda: socket.socket())
attempt("fork", os.fork)
attempt("run a program", lambda: subprocess.run(["true"]))
attempt("signal another process", lambda: os.kill(victim, 0))
attempt("chmod", lambda: os.chmod(scratch, 0o777))
attempt("allocate 8 GiB", lambda: np.ones(8 << 30, np.uint8))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def syscall(number, *args):
    if libc.syscall(number, *(ctypes.c_long(arg) for arg in args)) < 0:
        raise OSError(ctypes.get_errno(), f"syscall {number}")


attempt("limit another process", lambda: resource.prlimit(victim, resource.RLIMIT_CPU, (1, 1)))
attempt("read another's limit", lambda: resource.prlimit(victim, resource.RLIMIT_CPU))
attempt("renice another process", lambda: os.setpriority(os.PRIO_PROCESS, victim, 19))
attempt("renice a user", lambda: os.setpriority(os.PRIO_USER, 0, 19))
attempt("pin another process", lambda: os.sched_setaffinity(victim, {0}))
attempt("read another's I/O priority", lambda: syscall(252, 1, victim))
attempt("schedule another process", lambda: os.sched_getscheduler(victim))
attempt("read its own limit", lambda: resource.prlimit(os.getpid(), resource.RLIMIT_CPU))
attempt("renice itself", lambda: os.setpriority(os.PRIO_PROCESS, 0, 1))
attempt("read its own affinity", lambda: os.sched_getaffinity(0))
attempt("read its own I/O priority", lambda: syscall(252, 1, 0))
pages = mmap.mmap(-1, 2 * mmap.PAGESIZE)
address = ctypes.addressof(ctypes.c_char.from_buffer(pages))
attempt("remap its pages", lambda: syscall(25, address, 0, 4 * mmap.PAGESIZE, 1))
attempt("remap file pages", lambda: syscall(216, address, mmap.PAGESIZE, 0, 1, 0))
out["numpy"] = float(np.add(np.ones(4), np.ones(4)).sum())
thread = threading.Thread(target=lambda: out.__setitem__("thread", "ran"))
thread.start()
thread.join()
print(json.dumps(out))
"""


@pytest.fixture
def probe(tmp_path):
    """Run PROBE in a new process; its results as a dict."""
    (tmp_path / "scratch").mkdir()
    secret = tmp_path / "secret"
    secret.write_text("the daemon's token")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = subprocess.run(
            [
                sys.executable,
                str(script),
                str(os.getpid()),
                str(tmp_path / "scratch"),
                str(secret),
                str(victim.pid),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        victim.kill()
        victim.wait()
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), tmp_path


def test_what_a_sandboxed_process_keeps(probe):
    out, tmp_path = probe
    assert out["numpy"] == 8.0 and out["thread"] == "ran"
    assert out["write in scratch"] == "allowed"
    assert (tmp_path / "scratch" / "out").read_text() == "ok"
    assert out["allocate 8 GiB"] == "MemoryError"  # RLIMIT_AS
    for action in (
        "read its own limit",
        "renice itself",
        "read its own affinity",
        "read its own I/O priority",
    ):
        assert out[action] == "allowed", (action, out)


@pytest.mark.skipif(sandbox.landlock_abi() < 1, reason="the kernel has no Landlock")
def test_files_outside_its_folders_are_refused(probe):
    out, tmp_path = probe
    assert out["landlock"] == sandbox.landlock_abi()
    for action in (
        "read a file outside",
        "read the parent's command line",
        "list /dev/shm",
        "write outside",
    ):
        assert out[action] == "EACCES", (action, out)
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the seccomp filter is x86-64's")
def test_sockets_processes_and_signals_are_refused(probe):
    out, _ = probe
    assert out["seccomp"] is True and out["missing"] == []
    for action in (
        "open a socket",
        "fork",
        "run a program",
        "signal another process",
        "chmod",
        "limit another process",
        "read another's limit",
        "renice another process",
        "renice a user",
        "pin another process",
        "read another's I/O priority",
        "schedule another process",
        "remap its pages",
        "remap file pages",
    ):
        assert out[action] == "EPERM", (action, out)


def test_it_dies_with_its_parent(tmp_path):
    """PR_SET_PDEATHSIG: the parent SIGKILLed, the sandboxed child goes too."""
    code = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", '''
        import os, sys, time
        from simnpu.server.units import sandbox
        sandbox.enter(sandbox.Policy(readable=(), scratch={str(tmp_path)!r}, parent=os.getppid()))
        print(os.getpid(), flush=True)
        time.sleep(120)
        '''], stdout=subprocess.PIPE, text=True)
        print(child.stdout.readline().strip(), flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the sandboxed child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
