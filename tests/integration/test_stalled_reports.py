"""A kernel process that stalls, half-writes or garbles its report, or stops reading what the
daemon sends it, hurts only its own client (docs/kernel-isolation.md, "What comes back is
untrusted"): the daemon reads and sends without blocking (server/units/report_channel.py),
another client's launches keep completing, the stalled batch fails at its operator timeout
(507014) and a garbled report at once (507015), the process is ended, its client's next
launch works, and the daemon stops on SIGTERM.

Each test has a daemon of its own: one that hung would be killed and fail the test rather
than hang the rest of the run.
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading
import time

import numpy as np
import pytest
from conftest import alive
from test_kernel_isolation import MEMORY_ATTACKS, OUT, Victim, client_of

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

TIMEOUT_MS = 5000  # the attacker's operator timeout (aclrtSetOpExecuteTimeOutWithMs)
WITHIN_S = 30.0  # what a call must return within, or it is taken to hang

STALLER = '''
import os, stat, struct, threading, time, ctypes
from simnpu import kernel

STARTS = (  # what a kernel writes on its process's socket to the daemon
    struct.pack("!i", 4000) + b"[",  # a length of 4000 and one byte
    struct.pack("!i", 4000),  # a header only
    struct.pack("!i", -1) + bytes(3),  # half of a long header
    struct.pack("!i", (4 << 20) + 1),  # a report one byte too long
    struct.pack("!i", -1) + struct.pack("!Q", 1 << 62),  # a huge length
)


def daemon_socket() -> int:
    for fd in range(3, 64):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                return fd
        except OSError:
            pass
    raise LookupError("no socket")


def note(name):
    """A file `name` holding this process's pid in its scratch directory (its working
    directory), where the test looks for it."""
    with open(name + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.rename(name + ".tmp", name)


@kernel("ptr", "u32", "f64")
def stall(ctx, out, how, seconds):
    """Write this process's pid into out, the start of a report, STARTS[how], on its
    socket, then sleep."""
    ctx.gm(out, "int64", 1)[0] = os.getpid()
    os.write(daemon_socket(), STARTS[how])
    note("stalled")
    time.sleep(seconds)


@kernel("ptr", "f64")
def hang_up(ctx, out, seconds):
    """Write this process's pid into out, close its socket to the daemon, then sleep."""
    ctx.gm(out, "int64", 1)[0] = os.getpid()
    os.close(daemon_socket())
    time.sleep(seconds)


def never(*args):
    ctypes.PyDLL(None).sleep(3600)  # holds the interpreter's lock: nothing else runs


@kernel()
def stop_reading(ctx):
    """Once this batch has reported, the process's main loop never reads anything the
    daemon sends (no thread is left behind: that would end the process at once)."""
    from multiprocessing.connection import Connection

    Connection.recv = Connection.recv_bytes = never
    note("hogging")
'''

STALLS = ("partial", "header only", "half a long header")
GARBLED = ("one byte too long", "huge length")
HOWS = STALLS + GARBLED

# A module whose source is near the daemon's limit (1 MiB): the batch that brings it to a
# kernel process is more than the process's socket holds.
BIG = "PADDING = " + repr("p" * (900 << 10)) + "\n\n" + MEMORY_ATTACKS


def within(seconds: float, call, *args):
    """call(*args), asserting it returns within `seconds` (it runs in a thread of its own)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, call(*args)))
        except BaseException as error:  # noqa: BLE001 - raised below
            outcome.append((False, error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{getattr(call, '__name__', call)} did not return within {seconds:.0f} s"
    returned, value = outcome[0]
    if not returned:
        raise value
    return value


def settled(stream) -> int:
    """0 if the work on `stream` succeeded, else the code its synchronize reported (once:
    the stream works again after). A stream of its own, not the thread's current one:
    `within` runs it in another thread."""
    try:
        stream.synchronize()
    except NpuError as error:
        return error.code
    return 0


@contextlib.contextmanager
def killed_if_failing(daemon):
    """A daemon the test failed on is killed at once: its clients' calls then fail instead
    of hanging the test's clean-up."""
    try:
        yield
    except BaseException:
        daemon.process.kill()
        raise


def noted(daemon, name: str) -> int:
    """The pid of the kernel process that wrote note `name` (waits for it)."""
    deadline = time.monotonic() + WITHIN_S
    while True:
        for root in daemon.scratch_directories():
            for path in glob.glob(os.path.join(root, "*", name)):
                with open(path) as handle:
                    return int(handle.read())
        assert time.monotonic() < deadline, f"no kernel process noted {name!r}"
        time.sleep(0.02)


def assert_gone(pid: int) -> None:
    deadline = time.monotonic() + WITHIN_S
    while alive(pid):
        assert time.monotonic() < deadline, f"kernel process {pid} outlived its launch"
        time.sleep(0.02)


def limited_to_one_core(npu) -> None:
    """This client's kernels run on the first AI core only: its kernel process there is the
    one every launch reaches, and the other core stays for the bystander."""
    npu.runtime().devices.set_device_res_limit(0, codes.ACL_RT_DEV_RES_CUBE_CORE, 1)


def assert_next_launch_works(npu, stream) -> None:
    module = npu.Module.from_source(MEMORY_ATTACKS, "attacks.py")
    out = npu.DeviceBuffer(OUT)
    out.fill(0)
    module.function("mark").launch(1, out, stream=stream)
    assert within(WITHIN_S, settled, stream) == 0, "the attacker's next launch failed"
    assert out.to_numpy(np.int64)[0] == 7


def assert_unhurt(victim: Victim, rounds: int = 3) -> None:
    """The bystander mallocs, copies, launches add_f32 and synchronizes, `rounds` times."""
    for _ in range(rounds):
        assert within(WITHIN_S, victim.check) == {"intact": True, "works": True}


@pytest.mark.parametrize("how", STALLS)
def test_a_stalled_report_fails_only_its_client_at_its_operator_timeout(start_daemon, how):
    """A kernel writes the start of a report and sleeps: the bystander's launches keep
    completing meanwhile, the attacker's launch fails with 507014 at its operator timeout,
    the process is ended, the attacker's next launch works, the daemon stops."""
    daemon = start_daemon()
    victim = Victim(daemon.address)
    try:
        with client_of(daemon.address) as npu, killed_if_failing(daemon):
            limited_to_one_core(npu)
            stream = npu.Stream()
            npu.runtime().kernels.set_op_execute_timeout(TIMEOUT_MS)
            out = npu.DeviceBuffer(8)
            module = npu.Module.from_source(STALLER, "staller.py")
            module.function("stall").launch(1, out, HOWS.index(how), 3600.0, stream=stream)
            pid = noted(daemon, "stalled")
            assert_unhurt(victim)
            assert within(WITHIN_S, settled, stream) == codes.ACL_ERROR_RT_AICORE_TIMEOUT
            assert_gone(pid)
            assert_next_launch_works(npu, stream)
            assert_unhurt(victim, 1)
    finally:
        victim.close()
    assert daemon.stop() == 0, daemon.output()


@pytest.mark.parametrize("how", GARBLED)
def test_a_report_longer_than_a_report_may_be_ends_its_process_as_a_bad_report(start_daemon, how):
    """A kernel writes a header announcing more than a report may hold, then sleeps: the
    daemon refuses it on the header (a bad report), fails the launch with 507015 -- long
    before the operator timeout (the daemon's default) -- and ends the process."""
    daemon = start_daemon()
    victim = Victim(daemon.address)
    try:
        with client_of(daemon.address) as npu, killed_if_failing(daemon):
            limited_to_one_core(npu)
            stream = npu.Stream()
            out = npu.DeviceBuffer(8)
            module = npu.Module.from_source(STALLER, "staller.py")
            module.function("stall").launch(1, out, HOWS.index(how), 3600.0, stream=stream)
            code = within(WITHIN_S, settled, stream)
            assert code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
            assert "bad report" in daemon.output()
            assert_gone(int(out.to_numpy(np.int64)[0]))
            assert_unhurt(victim)
            assert_next_launch_works(npu, stream)
    finally:
        victim.close()
    assert daemon.stop() == 0, daemon.output()


def test_a_kernel_process_that_stops_reading_blocks_no_other_client(start_daemon):
    """A kernel makes its process's main loop stop reading; the next batch for it brings a
    module bigger than its socket holds. The daemon's send returns at once:
    the bystander's launches complete, the batch fails at its operator timeout (507014),
    the process is ended, the attacker's next launch works, the daemon stops."""
    daemon = start_daemon()
    victim = Victim(daemon.address)
    try:
        with client_of(daemon.address) as npu, killed_if_failing(daemon):
            limited_to_one_core(npu)
            stream = npu.Stream()
            npu.runtime().kernels.set_op_execute_timeout(TIMEOUT_MS)
            staller = npu.Module.from_source(STALLER, "staller.py")
            big = npu.Module.from_source(BIG, "big.py")
            out = npu.DeviceBuffer(OUT)  # (before: a malloc later would mean a new process)
            staller.function("stop_reading").launch(1, stream=stream)
            assert within(WITHIN_S, settled, stream) == 0
            pid = noted(daemon, "hogging")
            big.function("mark").launch(
                1, out, stream=stream
            )  # to the process that no longer reads
            assert_unhurt(victim)
            assert within(WITHIN_S, settled, stream) == codes.ACL_ERROR_RT_AICORE_TIMEOUT
            assert_gone(pid)
            assert_next_launch_works(npu, stream)
    finally:
        victim.close()
    assert daemon.stop() == 0, daemon.output()


def test_the_daemon_stops_while_a_report_stalls(start_daemon):
    """SIGTERM while a kernel process has half-written its report (and its operator timeout,
    the daemon's default, is far off): the daemon stops, leaving no process behind."""
    daemon = start_daemon()
    stopped = False
    try:
        with client_of(daemon.address) as npu, killed_if_failing(daemon):
            stream = npu.Stream()
            out = npu.DeviceBuffer(8)
            module = npu.Module.from_source(STALLER, "staller.py")
            module.function("stall").launch(1, out, HOWS.index("partial"), 3600.0, stream=stream)
            pid = noted(daemon, "stalled")
            assert daemon.stop() == 0, daemon.output()
            stopped = True
    except NpuError:  # the client's own end, its daemon gone, fails: only after the stop
        if not stopped:
            raise
    assert not alive(pid)


def test_a_kernel_that_closes_its_socket_is_not_waited_for(start_daemon):
    """A kernel closes its process's socket to the daemon and sleeps: the daemon gives the
    process its time to exit by itself without waiting for it (the bystander's launches go
    on meanwhile), then kills it and says so to the attacker alone; the attacker's next
    launch works."""
    daemon = start_daemon()
    victim = Victim(daemon.address)
    try:
        with client_of(daemon.address) as npu, killed_if_failing(daemon):
            limited_to_one_core(npu)
            stream = npu.Stream()
            module = npu.Module.from_source(STALLER, "staller.py")
            out = npu.DeviceBuffer(8)
            module.function("hang_up").launch(1, out, 3600.0, stream=stream)
            assert_unhurt(victim)
            with pytest.raises(NpuError) as failed:
                within(WITHIN_S, stream.synchronize)
            assert "closed its socket to the daemon while it still ran" in str(failed.value)
            assert_gone(int(out.to_numpy(np.int64)[0]))
            assert_next_launch_works(npu, stream)
    finally:
        victim.close()
    assert daemon.stop() == 0, daemon.output()
