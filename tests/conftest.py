"""Fixtures that start real daemons, and the checks that nothing outlives a test.

Every daemon here is a real `python -m simnpu.server` process on a private Unix socket.
After each test, every simnpu shared-memory segment must belong to a daemon that is
still running; after the run, none may exist and no daemon or worker may be alive.
"""

from __future__ import annotations

import contextlib
import difflib
import glob
import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from simnpu.client import autostart
from simnpu.server.units.kernel_processes import SCRATCH_PREFIX

os.environ["SIMNPU_AUTOSTART"] = "0"  # a test that wants autostart says so itself
os.environ.pop("SIMNPU_ADDRESS", None)
os.environ.pop("SIMNPU_NO_SHM", None)

SHM_DIR = "/dev/shm"
_started: list["DaemonProcess"] = []  # daemons of this run: the leak checks judge theirs


DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def docs_script(name: str):
    """docs/<name>.py, a script beside the pages it writes, loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stale_lines(script) -> str:
    """What a docs script (`PAGE`, `render`, `page_with`) would change in its page: a unified
    diff, empty when the page is what the code renders."""
    page = script.PAGE.read_text(encoding="utf-8")
    wanted = script.page_with(script.render(), page)
    return "".join(
        difflib.unified_diff(
            page.splitlines(keepends=True), wanted.splitlines(keepends=True), "page", "code"
        )
    )


def simnpu_segments() -> list[str]:
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith("simnpu-"))


def made_since(paths: list[str], since: float) -> list[str]:
    """Those of `paths` (files or directories) made at `since` (time.time()) or later. A
    daemon names its segments and scratch directories by its pid; this tells them from the
    leftovers of a process long gone that had the same pid (a SIGKILLed daemon's)."""
    made = []
    for path in paths:
        try:
            if os.stat(path).st_ctime >= since:
                made.append(path)
        except FileNotFoundError:
            pass
    return made


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid`: a daemon's workers, its kernel zygote and kernel processes."""
    found = []
    for child in children_of(pid):
        found += [child, *descendants(child)]
    return found


def born(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot), or None if there is none: with
    the pid, it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class DaemonProcess:
    """A daemon started by a test; stop() checks it left nothing behind. `prefix`: a
    command that runs the daemon's command line given after it (it must exec it, so that
    the daemon keeps its pid), e.g. in a namespace of its own."""

    def __init__(self, directory, *flags, env=None, address=None, prefix=()):
        self.address = address or f"unix://{directory}/npu.sock"
        self.log_path = os.path.join(directory, "daemon.log")
        self.log = open(self.log_path, "wb")
        # what this daemon makes is made after this (less the file system's coarser clock)
        self._since = time.time() - 1.0
        self.process = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "simnpu.server",
                "--listen",
                self.address,
                "--memory",
                "256MiB",
                "--log-level",
                os.environ.get("SIMNPU_TEST_LOG_LEVEL", "WARNING"),
                *flags,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self.pid = self.process.pid
        _started.append(self)
        self.workers: list[int] = []
        self._born: dict[int, str | None] = {}  # pid -> start time, of workers and kernel processes
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not autostart.reachable(self.address):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"daemon exited with {self.process.returncode}:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"daemon did not come up:\n{self.output()}")
            time.sleep(0.02)
        self.workers = children_of(self.pid)
        self._born = {pid: born(pid) for pid in self.workers}

    def outliving(self, pids: list[int]) -> list[int]:
        """Those of `pids` (recorded processes of this daemon) still running, pids reused by
        other processes since aside."""
        return [pid for pid in pids if alive(pid) and born(pid) == self._born.get(pid)]

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def segments(self) -> list[str]:
        """The shared-memory segments this daemon made that still exist."""
        named = [name for name in simnpu_segments() if name.startswith(f"simnpu-{self.pid}-")]
        made = made_since([os.path.join(SHM_DIR, name) for name in named], self._since)
        return [os.path.basename(path) for path in made]

    def scratch_directories(self) -> list[str]:
        """The kernel processes' scratch directories this daemon made that still exist."""
        pattern = os.path.join(tempfile.gettempdir(), f"{SCRATCH_PREFIX}{self.pid}-*")
        return made_since(glob.glob(pattern), self._since)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop the daemon; assert its segments and worker processes are gone."""
        below = descendants(self.pid)  # kernel processes are the zygote's children
        self._born.update((pid, born(pid)) for pid in below)
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
                raise AssertionError(f"daemon ignored signal {sig}:\n{self.output()}")
        self.log.close()
        deadline = time.monotonic() + 10
        while self.outliving(self.workers + below) and time.monotonic() < deadline:
            time.sleep(0.05)  # kernel processes end after their zygote
        assert not self.outliving(self.workers + below), (
            "worker or kernel processes outlived the daemon"
        )
        while self.scratch_directories() and time.monotonic() < deadline:  # the zygote removes it
            time.sleep(0.05)
        assert not self.scratch_directories(), "kernel scratch directories outlived the daemon"
        assert not self.segments(), f"daemon left shared memory behind: {self.segments()}"
        failures = internal_errors(self.output())
        assert not failures, "the daemon failed inside:\n" + "\n\n".join(failures)
        return self.process.returncode


def internal_errors(log: str) -> list[str]:
    """The tracebacks in a daemon's log."""
    lines = log.splitlines()
    return [
        "\n".join(lines[max(0, index - 1) : index + 30])
        for index, line in enumerate(lines)
        if line.startswith("Traceback")
    ]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """A daemon shared by the tests of one module (1 device, 256 MiB, 2 AI cores)."""
    process = DaemonProcess(tmp_path_factory.mktemp("npu"))
    yield process
    assert process.stop() == 0, process.output()


@pytest.fixture(scope="module")
def daemon4(tmp_path_factory):
    """A daemon with 4 devices of 96 MiB shared by the tests of one module: one device per
    rank of a 4-rank communicator, as on hardware."""
    process = DaemonProcess(tmp_path_factory.mktemp("npu4"), "--devices", "4", "--memory", "96MiB")
    yield process
    assert process.stop() == 0, process.output()


@pytest.fixture
def start_daemon(tmp_path):
    """Factory for a daemon with its own flags, stopped (and checked) after the test."""
    made = []

    def start(*flags, env=None, address=None, prefix=()):
        directory = tmp_path / f"d{len(made)}"
        directory.mkdir()
        made.append(DaemonProcess(directory, *flags, env=env, address=address, prefix=prefix))
        return made[-1]

    yield start
    for process in made:
        process.stop()


@pytest.fixture
def npu(daemon):
    """This test process as a client of the module's daemon (the Pythonic API)."""
    import simnpu.client as client

    client.connect(daemon.address)
    yield client
    client.shutdown()


@pytest.fixture
def acl(daemon, monkeypatch):
    """This test process as a pyACL program of the module's daemon, device 0 set."""
    import acl

    monkeypatch.setenv("SIMNPU_ADDRESS", daemon.address)
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    acl.get_recent_err_msg()
    yield acl
    acl.rt.reset_device(0)
    assert acl.finalize() == 0


@pytest.fixture
def spawn_environment():
    """What ProcessExecutor.start sets in this process for the processes it spawns
    (server/units/spawning.py: PYTHONSAFEPATH, GLIBC_TUNABLES, sys.path) is put back after
    the test: a later test's `python script.py` must still import beside its script."""
    saved = {name: os.environ.get(name) for name in ("PYTHONSAFEPATH", "GLIBC_TUNABLES")}
    path = list(sys.path)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    sys.path[:] = path


# A kernel that holds its stream until the host sets flag[0] (or fails after `limit` s):
# tests use it to create orderings without timing.
GATE = '''
import time
from simnpu import kernel


@kernel("ptr", "f64")
def gate(ctx, flag, limit):
    """Hold the stream until the host sets flag[0]."""
    view = ctx.gm(flag, "int32", 1, access="r")
    deadline = time.monotonic() + limit
    while view[0] == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the gate was never opened")
        time.sleep(0.0002)
'''

FAIL = '''

@kernel("u32")
def fail(ctx, length):
    """Raise with a message of `length` characters."""
    raise RuntimeError("x" * length)
'''  # follows GATE (which imports `kernel`) in a module's source


@contextlib.contextmanager
def runtime_of(address: str):
    """A raw Runtime of the daemon at `address` with device 0 set, closed after use."""
    from simnpu.client.runtime import Runtime

    rt = Runtime(address)
    try:
        rt.contexts.set_device(0)
        yield rt
    finally:
        rt.close()


def round_trip(rt, value: float = 1.0, blocks: int = 2, n: int = 4096) -> None:
    """Prove `rt` (a raw Runtime, current device set) works: malloc, copy in, add_f32 over
    `blocks` blocks on a new stream, synchronize, copy out, check, free."""
    import numpy as np

    from simnpu.proto import codes, commands

    a = np.arange(n, dtype=np.float32)
    b = np.full(n, value, np.float32)
    ptrs = [rt.memory.malloc(a.nbytes) for _ in range(3)]
    stream = rt.streams.create_stream()
    try:
        rt.memory.memcpy(
            ptrs[0], a.nbytes, a.ctypes.data, a.nbytes, codes.ACL_MEMCPY_HOST_TO_DEVICE
        )
        rt.memory.memcpy(
            ptrs[1], b.nbytes, b.ctypes.data, b.nbytes, codes.ACL_MEMCPY_HOST_TO_DEVICE
        )
        add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
        rt.kernels.launch_kernel(add, blocks, rt.kernels.signature(add).pack(*ptrs, n), stream)
        rt.sync.synchronize_stream(stream)
        out = np.zeros(n, np.float32)
        rt.memory.memcpy(
            out.ctypes.data, out.nbytes, ptrs[2], out.nbytes, codes.ACL_MEMCPY_DEVICE_TO_HOST
        )
        assert np.array_equal(out, a + value)
    finally:
        rt.streams.destroy_stream(stream)
        for ptr in ptrs:
            rt.memory.free(ptr)


def run_client(
    address: str, code: str, timeout: float = 120, env=None
) -> subprocess.CompletedProcess:
    """Run `code` in a new Python process whose SIMNPU_ADDRESS is `address`."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "SIMNPU_ADDRESS": address, **(env or {})},
    )


def start_client(address: str, code: str, env=None, stdin: bool = False) -> subprocess.Popen:
    """Like run_client, without waiting (with `stdin`, a pipe to its standard input)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": address, **(env or {})},
    )


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """After each test every segment of this run's daemons belongs to one still running
    (tests that start daemons another way, e.g. autostart, check theirs themselves)."""
    yield
    ours = {p.pid for p in _started}
    deadline = time.monotonic() + 5
    while True:
        orphans = [
            name
            for name in simnpu_segments()
            if int(name.split("-")[1]) in ours and not alive(int(name.split("-")[1]))
        ]
        if not orphans or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not orphans, f"shared memory of dead daemons left behind: {orphans}"


def pytest_sessionfinish(session, exitstatus):
    """After the run: no daemon or worker we started is alive, no simnpu segment exists."""
    leftovers = [p.pid for p in _started if p.process.poll() is None]
    workers = [pid for p in _started for pid in p.outliving(p.workers)]
    for pid in leftovers + workers:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(pid, signal.SIGKILL)
    segments = [n for n in simnpu_segments() if int(n.split("-")[1]) in {p.pid for p in _started}]
    if leftovers or workers or segments:
        print(
            f"\nLEAK: daemons {leftovers}, workers {workers}, segments {segments}", file=sys.stderr
        )
        session.exitstatus = 1
