"""Sessions: whatever way a client's session ends, the daemon frees all it owned; many
clients at once; the last-error slot; the in-stream fallback; autostart."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time

import numpy as np
import pytest
from conftest import (
    alive,
    children_of,
    internal_errors,
    round_trip,
    run_client,
    runtime_of,
    simnpu_segments,
    start_client,
)
from device_peek import peek

from simnpu.client.runtime import Runtime
from simnpu.client.tools.query import query
from simnpu.proto import codes, commands
from simnpu.proto import observe as observe_bits
from simnpu.proto.errors import NpuError

H2H = codes.ACL_MEMCPY_HOST_TO_HOST
H2D = codes.ACL_MEMCPY_HOST_TO_DEVICE
D2H = codes.ACL_MEMCPY_DEVICE_TO_HOST
D2D = codes.ACL_MEMCPY_DEVICE_TO_DEVICE
DEFAULT = codes.ACL_MEMCPY_DEFAULT
MiB = 1 << 20


def eventually(check, timeout: float = 30.0, what: str = "condition"):
    """Poll `check()` until it returns something true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        time.sleep(0.05)


def session_segments(daemon, session_id: int) -> list[str]:
    return [
        name for name in simnpu_segments() if name.startswith(f"simnpu-{daemon.pid}-s{session_id}-")
    ]


def sessions(daemon) -> dict[int, dict]:
    return {p["session"]: p for p in query("processes", address=daemon.address)["processes"]}


@pytest.fixture(scope="module")
def observer(daemon):
    """A client that watches the daemon's memory and must keep working throughout."""
    rt = Runtime(daemon.address)
    rt.contexts.set_device(0)
    yield rt
    rt.close()


def assert_all_freed(daemon, observer: Runtime, session_id: int) -> None:
    """The session is gone from the daemon with everything it owned."""
    total = observer.memory.get_mem_info()[1]
    eventually(
        lambda: observer.memory.get_mem_info()[0] == total, what="device memory back to fully free"
    )
    wait_until_gone(daemon, session_id)
    round_trip(observer)


def wait_until_gone(daemon, session_id: int) -> None:
    """The session's segments and the session itself are gone from the daemon."""
    eventually(
        lambda: not session_segments(daemon, session_id),
        what=f"session {session_id}'s segments gone",
    )
    eventually(
        lambda: session_id not in sessions(daemon),
        what=f"session {session_id} gone from the daemon",
    )


@contextlib.contextmanager
def shared_marks(daemon, observer: Runtime, nbytes: int):
    """`nbytes` zeroed bytes of the observer's device memory that another client imports
    and its kernels mark, one byte per run: they outlive that client. Yields the import key
    and a function that counts the marked bytes (read from the device); freed after."""
    address = observer.memory.malloc(nbytes)
    observer.memory.memset(address, nbytes, 0, nbytes)
    flags = codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
    key = observer.memory.ipc_mem_get_export_key(address, nbytes, flags)
    try:
        yield key, lambda: sum(peek(daemon.pid, address, nbytes))
    finally:
        observer.memory.ipc_mem_close(key)
        observer.memory.free(address)


# ---- a session ends: the daemon frees everything ------------------------------------------------
OWNER = """
    import ctypes, os, sys, time
    import numpy as np
    import simnpu.client as npu
    from simnpu.client.runtime import Runtime
    from simnpu.proto import commands
    rt = npu.connect()
    rt.contexts.set_device(0)
    marks = {marks}
    nap = rt.kernels.get_function(rt.kernels.binary_load({nap!r}), "nap")
    big = rt.memory.malloc(64 << 20)
    small = [rt.memory.malloc(4096 * (i + 1)) for i in range(8)]
    pinned = rt.host.malloc_host(1 << 20)
    ctypes.memset(pinned, 7, 1 << 20)
    streams = [rt.streams.create_stream(), rt.streams.create_stream(priority=3)]
    events = [rt.events.create_event() for _ in range(4)]
    rt.contexts.create_context(0)  # a second context with its own default stream, made current
    extra = rt.streams.create_stream()
    rt.contexts.set_device(0)
    for first, stream in zip((0, {launches}), streams):
        for slot in range(first, first + {launches}):
            args = rt.kernels.signature(nap).pack(marks, slot, {seconds})
            rt.kernels.launch_kernel(nap, 1, args, stream)
    rt.events.record_event(events[0], streams[0])
    rt.events.stream_wait_event(streams[1], events[0])
    rt.memory.memcpy_async(big, 1 << 20, pinned, 1 << 20, 1, streams[1])
    print(rt.session_id, flush=True)
    {ending}
"""

NAP = """
from simnpu import kernel
import time
@kernel("ptr", "u32", "f64")
def nap(ctx, marks, slot, seconds):
    ctx.gm(marks + slot, "uint8", 1)[0] = 1
    time.sleep(seconds)
"""


def owner_code(marks: str, launches: int, seconds: float, ending: str) -> str:
    """A client that owns memory, pinned memory, streams, events and queued kernels, each
    kernel run marking its own byte of the device buffer `marks` (an expression: at least
    2 * launches bytes); it prints its session id, then ends by `ending`."""
    return OWNER.format(marks=marks, nap=NAP, launches=launches, seconds=seconds, ending=ending)


ENDINGS = {
    "normal close": "rt.sync.synchronize_device(); npu.shutdown()",
    "exception": "raise RuntimeError('the client crashed')",
    "exit without closing": "os._exit(0)",
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_ending_session_frees_everything(daemon, observer, ending):
    code = owner_code("rt.memory.malloc(4096)", launches=2, seconds=0.0, ending=ENDINGS[ending])
    result = run_client(daemon.address, code)
    assert result.returncode == (1 if ending == "exception" else 0), result.stderr
    if ending == "exception":
        assert "the client crashed" in result.stderr
    assert_all_freed(daemon, observer, int(result.stdout.split()[0]))


def test_sigkill_mid_flight_frees_everything_and_drops_queued_work(daemon, observer):
    launches = 10
    with shared_marks(daemon, observer, 2 * launches) as (key, marked):
        marks = f"rt.memory.ipc_mem_import_by_key({key!r})"
        code = owner_code(marks, launches=launches, seconds=0.5, ending="time.sleep(120)")
        process = start_client(daemon.address, code)
        try:
            line = process.stdout.readline()
            assert line, process.stderr.read()
            session_id = int(line)
            eventually(marked, what="the first kernels running")
            # mid-flight: its memory, segments, streams and queued kernels are all there
            free, total = observer.memory.get_mem_info()
            assert total - free >= 64 * MiB
            assert any("-pin" in name for name in session_segments(daemon, session_id))
            assert any(name.endswith("-staging") for name in session_segments(daemon, session_id))
            assert sessions(daemon)[session_id]["streams"] == 5  # 2 defaults + 3 created
            process.send_signal(signal.SIGKILL)
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate()
        wait_until_gone(daemon, session_id)
        ran = marked()
        time.sleep(1.0)  # long enough for two more 0.5 s kernels, had the queue been kept
        assert marked() == ran, "queued kernels of the dead client still ran"
        assert ran < 2 * launches
    assert_all_freed(daemon, observer, session_id)
    # the kernel running at the kill completed after the session was gone: nothing failed
    assert not internal_errors(daemon.output())


INTERRUPTED = """
import os, signal, sys, time
import simnpu.client as npu

# Ctrl-C raises KeyboardInterrupt even in a client started from a background job (which
# inherits SIGINT ignored, and Python then keeps it ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)

SOURCE = '''
import time
from simnpu import kernel


@kernel("ptr", "u32", "f64")
def nap(ctx, marks, slot, seconds):
    time.sleep(seconds)
    ctx.gm(marks + slot, "uint8", 1)[0] = 1
'''
try:
    with npu.Device(0):
        stream = npu.Stream()
        marks = npu.DeviceBuffer.ipc_import({key!r})
        nap = npu.Module.from_source(SOURCE, "naps.py").function("nap")
        for slot in range({launches}):
            nap.launch(1, marks, slot, 0.05, stream=stream)
        print("queued", flush=True)
        {wait}
except KeyboardInterrupt:
    print("interrupted", flush=True)  # out of the `with` block: the device was reset
    deadline = time.monotonic() + 60
    while not os.path.exists({done!r}) and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(130)
"""


@pytest.mark.parametrize("wait", ["stream.synchronize()", "stream.record().synchronize()"])
def test_ctrl_c_in_the_pythonic_api_drops_queued_work(daemon, observer, tmp_path, wait):
    """Ctrl-C while a `with Device(...)` block waits: leaving the block drops the device
    work not started yet (aclrtResetDevice would otherwise wait for all of it)."""
    launches, done = 400, tmp_path / "done"  # 20 s of work, had it been kept
    with shared_marks(daemon, observer, launches) as (key, marked):
        code = INTERRUPTED.format(key=key, launches=launches, wait=wait, done=str(done))
        process = start_client(daemon.address, code)
        try:
            assert process.stdout.readline() == "queued\n", process.stderr.read()
            eventually(marked, what="the first kernel running")
            process.send_signal(signal.SIGINT)
            line = process.stdout.readline()
            if line != "interrupted\n":  # say how the client ended, with what it wrote
                ended = process.wait(30)
                pytest.fail(
                    f"the client wrote {line!r}, ended with {ended}: {process.stderr.read()}"
                )
            ran = marked()  # while the interrupted client still lives
            assert 1 <= ran < launches
            time.sleep(0.5)  # long enough for ten more kernels, had the queue been kept
            assert marked() == ran, "queued kernels ran after the interrupt"
        finally:
            done.write_text("")
            try:
                _, err = process.communicate(timeout=60)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.communicate()
    assert process.returncode == 130, err


def test_an_in_process_close_frees_what_it_owned(daemon, observer):
    rt = Runtime(daemon.address)
    rt.contexts.set_device(0)
    session_id = rt.session_id
    rt.memory.malloc(32 * MiB)
    pinned = rt.host.malloc_host(MiB)
    stream = rt.streams.create_stream()
    rt.events.create_event()
    rt.memory.memcpy_async(rt.memory.malloc(MiB), MiB, pinned, MiB, H2D, stream)
    assert observer.memory.get_mem_info()[0] < observer.memory.get_mem_info()[1] - 32 * MiB
    assert session_segments(daemon, session_id)
    rt.close()
    rt.close()  # idempotent
    assert_all_freed(daemon, observer, session_id)
    with pytest.raises(NpuError):
        rt.memory.malloc(64)


def test_close_right_after_asynchronous_calls_returns_at_once(daemon, observer):
    """close() may follow a free or a launch that has not been sent yet; it must end the
    session cleanly rather than wait for its 5 s fallback (guard: 4 s)."""
    for round_ in range(6):
        rt = Runtime(daemon.address)
        rt.contexts.set_device(0)
        ptr, spare = rt.memory.malloc(4096), rt.memory.malloc(4096)
        fill = rt.kernels.get_function(commands.BUILTIN_BINARY, "fill_f32")
        rt.kernels.launch_kernel(fill, 1, rt.kernels.signature(fill).pack(ptr, 1.0, 16), 0)
        rt.memory.free(spare)
        closer = threading.Thread(target=rt.close)
        closer.start()
        closer.join(4)
        assert not closer.is_alive(), f"close() hung (round {round_})"
        assert_all_freed(daemon, observer, rt.session_id)


# ---- many clients at once ------------------------------------------------------------------------
WORKER = """
    import numpy as np
    import simnpu.client as npu
    seed = {seed}
    rng = np.random.default_rng(seed)
    n = 50_000 + 1000 * seed
    with npu.Device(0):
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        s1, s2 = npu.Stream(), npu.Stream(priority=seed % 8)
        pinned = npu.PinnedBuffer(a.nbytes)
        pinned.array(np.float32)[:] = a
        x, y, z, w = (npu.DeviceBuffer(a.nbytes) for _ in range(4))
        for round_ in range(5):
            x.copy_from_host(pinned.array(np.float32), stream=s1)
            y.copy_from_host(b, stream=s2)
            ready = s2.record()
            s1.wait_event(ready)
            npu.builtin("add_f32").launch(3, x, y, z, n, stream=s1)
            npu.builtin("mul_f32").launch(2, z, z, w, n, stream=s1)
            npu.builtin("relu_f32").launch(1, w, z, n, stream=s1)
            s1.synchronize()
            expected = np.maximum((a + b) * (a + b), 0)
            assert np.allclose(z.to_numpy(np.float32), expected), (seed, round_)
            ready.destroy()
        for buffer in (x, y, z, w, pinned):
            buffer.free()
        s1.destroy()
        s2.destroy()
    print("ok", seed)
"""


@pytest.mark.multiprocess
def test_several_clients_at_once_each_get_their_own_results(daemon, observer):
    processes = [start_client(daemon.address, WORKER.format(seed=seed)) for seed in range(4)]
    try:
        outputs = [process.communicate(timeout=120) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    for seed, (process, (out, err)) in enumerate(zip(processes, outputs)):
        assert process.returncode == 0, err
        assert out.split() == ["ok", str(seed)]
    eventually(
        lambda: observer.memory.get_mem_info()[0] == observer.memory.get_mem_info()[1],
        what="memory freed",
    )


# ---- the last-error slot -------------------------------------------------------------------------
def test_get_last_error_clears_and_peek_does_not(daemon):
    rt = Runtime(daemon.address)
    try:
        rt.devices.get_last_error()  # the slot is the thread's: clear what an earlier test left
        assert rt.devices.get_last_error() == codes.ACL_SUCCESS
        with pytest.raises(NpuError):
            rt.streams.create_stream()  # no context yet
        assert rt.devices.peek_at_last_error() == codes.ACL_ERROR_RT_CONTEXT_NULL
        assert rt.devices.peek_at_last_error() == codes.ACL_ERROR_RT_CONTEXT_NULL
        assert rt.devices.get_last_error() == codes.ACL_ERROR_RT_CONTEXT_NULL
        assert rt.devices.get_last_error() == codes.ACL_SUCCESS
        assert rt.devices.peek_at_last_error() == codes.ACL_SUCCESS
        rt.contexts.set_device(0)
        with pytest.raises(NpuError):
            rt.memory.malloc(1 << 40)
        round_trip(rt)  # successful calls leave the slot alone
        assert rt.devices.peek_at_last_error() == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
        with pytest.raises(NpuError):
            rt.sync.synchronize_stream(0xBAD)  # the latest error wins
        assert rt.devices.get_last_error() == codes.ACL_ERROR_RT_INVALID_HANDLE

        seen = {}

        def other_thread():  # the slot is per thread
            seen["before"] = rt.devices.peek_at_last_error()
            try:
                rt.memory.free(0)
            except NpuError:
                pass
            seen["after"] = rt.devices.peek_at_last_error()

        with pytest.raises(NpuError):
            rt.sync.synchronize_stream(0xBAD)
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(30)
        assert seen == {"before": codes.ACL_SUCCESS, "after": codes.ACL_ERROR_INVALID_PARAM}
        assert rt.devices.get_last_error() == codes.ACL_ERROR_RT_INVALID_HANDLE
    finally:
        rt.close()


# ---- the in-stream fallback (no shared memory with the daemon) -----------------------------------
SIZES = [0, 1, 4097, 3 * MiB + 5]


def copy_everything(rt: Runtime, size: int) -> list[bytes]:
    """Every copy kind, pinned and pageable, sync and async; the bytes each produced."""
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    n = max(size, 1)
    d1, d2, d3 = (rt.memory.malloc(n) for _ in range(3))
    p1, p2 = rt.host.malloc_host(n), rt.host.malloc_host(n)
    stream = rt.streams.create_stream()
    results = []

    def read(ptr) -> bytes:
        out = np.zeros(n, np.uint8)
        rt.memory.memcpy(out.ctypes.data, n, ptr, size, D2H)
        return out[:size].tobytes()

    def clear(*ptrs) -> None:
        for ptr in ptrs:
            rt.memory.memset(ptr, n, 0, n)

    # synchronous, pageable
    rt.memory.memcpy(d1, n, data.ctypes.data, size, H2D)
    results.append(read(d1))
    rt.memory.memcpy(d2, n, d1, size, D2D)
    results.append(read(d2))
    # synchronous, pinned
    ctypes.memmove(p1, data.ctypes.data, size)
    clear(d1)
    rt.memory.memcpy(d1, n, p1, size, H2D)
    rt.memory.memcpy(p2, n, d1, size, D2H)
    results.append(ctypes.string_at(p2, size))
    # asynchronous, pinned
    clear(d1, d2)
    ctypes.memset(p2, 0, n)
    rt.memory.memcpy_async(d1, n, p1, size, H2D, stream)
    rt.memory.memcpy_async(d2, n, d1, size, D2D, stream)
    rt.memory.memcpy_async(p2, n, d2, size, D2H, stream)
    rt.sync.synchronize_stream(stream)
    results.append(ctypes.string_at(p2, size))
    # asynchronous, pageable
    clear(d3)
    out = np.zeros(n, np.uint8)
    rt.memory.memcpy_async(d3, n, data.ctypes.data, size, H2D, stream)
    rt.memory.memcpy_async(out.ctypes.data, n, d3, size, D2H, stream)
    rt.sync.synchronize_stream(stream)
    results.append(out[:size].tobytes())
    # ACL_MEMCPY_DEFAULT: the direction from the addresses
    clear(d2)
    rt.memory.memcpy(d2, n, data.ctypes.data, size, DEFAULT)
    rt.memory.memcpy_async(d3, n, d2, size, DEFAULT, stream)
    rt.sync.synchronize_stream(stream)
    out = np.zeros(n, np.uint8)
    rt.memory.memcpy(out.ctypes.data, n, d3, size, DEFAULT)
    results.append(out[:size].tobytes())
    # host to host, pinned and pageable
    out = np.zeros(n, np.uint8)
    rt.memory.memcpy(out.ctypes.data, n, p1, size, H2H)
    results.append(out[:size].tobytes())
    # memset of device memory, sync and async
    rt.memory.memset(d1, n, 0xA5, size)
    rt.memory.memset_async(d2, n, 0x3C, size, stream)
    rt.sync.synchronize_stream(stream)
    results += [read(d1), read(d2)]
    rt.streams.destroy_stream(stream)
    for ptr in (d1, d2, d3):
        rt.memory.free(ptr)
    for ptr in (p1, p2):
        rt.host.free_host(ptr)
    expected = [data.tobytes()] * 7 + [b"\xa5" * size, b"\x3c" * size]
    assert results == expected, (
        f"size {size}: "
        f"copies {[i for i, (r, e) in enumerate(zip(results, expected)) if r != e]} differ"
    )
    return results


@pytest.fixture
def in_stream(daemon, monkeypatch):
    monkeypatch.setenv("SIMNPU_NO_SHM", "1")
    rt = Runtime(daemon.address)
    monkeypatch.delenv("SIMNPU_NO_SHM")
    rt.contexts.set_device(0)
    yield rt
    rt.close()


@pytest.fixture
def shared(daemon):
    with runtime_of(daemon.address) as rt:
        yield rt


def test_shared_memory_is_used_unless_out_of_reach(shared, in_stream):
    assert shared.memory.uses_shared_memory is True
    assert in_stream.memory.uses_shared_memory is False


@pytest.mark.parametrize("size", SIZES)
def test_in_stream_fallback_gives_identical_results(shared, in_stream, size):
    assert copy_everything(in_stream, size) == copy_everything(shared, size)


def test_traced_sessions_copy_pageable_chunks_as_tasks(start_daemon, monkeypatch):
    """While an observer traces, a synchronous pageable copy's chunks are tasks of the hidden
    synchronous-copies stream (the timeline shows each), for both transports; without one the
    session copies them itself. The results are the same either way."""
    size = 20 * MiB + 5  # chunks of both transports: several of each
    untraced = Runtime(start_daemon().address)
    untraced.contexts.set_device(0)
    daemon = start_daemon()
    monkeypatch.setenv("SIMNPU_NO_SHM", "1")
    in_stream = Runtime(daemon.address)
    monkeypatch.delenv("SIMNPU_NO_SHM")
    shared = Runtime(daemon.address)
    for rt in (in_stream, shared):
        rt.contexts.set_device(0)
        rt.observer.enable(observe_bits.TRACE)
    expected = copy_everything(untraced, size)
    assert copy_everything(in_stream, size) == copy_everything(shared, size) == expected
    for rt in (in_stream, shared):
        trace = rt.observer.trace()
        tracks = {
            (e["pid"], e["tid"]): e["args"]["name"]
            for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"
        }
        chunks = [
            e["name"]
            for e in trace["traceEvents"]
            if e["ph"] == "X"
            and e["cat"] == "copy"
            and tracks[(e["pid"], e["tid"])] == "synchronous copies (device 0)"
            and e["args"]["bytes"] == rt.memory.copies.slot
        ]
        assert {name.split()[1] for name in chunks} == {"H2D", "D2H"}, chunks
        rt.close()
    untraced.close()


def test_in_stream_client_in_its_own_process(daemon):
    result = run_client(
        daemon.address,
        """
        import numpy as np
        import simnpu.client as npu
        runtime = npu.runtime()
        assert not runtime.memory.uses_shared_memory
        with npu.Device(0):
            data = np.arange(3 * 2**20 + 5, dtype=np.uint8)
            pinned = npu.PinnedBuffer(data.nbytes)
            pinned.array()[:] = data
            buffer = npu.DeviceBuffer(data.nbytes)
            stream = npu.Stream()
            buffer.copy_from_host(pinned.array(), stream=stream)
            stream.synchronize()
            assert np.array_equal(buffer.to_numpy(), data)
            buffer.free()
            pinned.free()
        print("ok")
    """,
        env={"SIMNPU_NO_SHM": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# ---- autostart -----------------------------------------------------------------------------------
AUTOSTARTED = """
    import os, sys, time
    import numpy as np
    from simnpu.client.runtime import Runtime
    from simnpu.client.tools.query import query
    rt = Runtime()
    rt.contexts.set_device(0)
    barrier = {barrier!r}
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(barrier)) < 3:  # every client is connected before any leaves
        assert time.monotonic() < deadline, "the other clients never connected"
        time.sleep(0.02)
    a = np.arange(1000, dtype=np.float32)
    x, y = rt.memory.malloc(4000), rt.memory.malloc(4000)
    rt.memory.memcpy(x, 4000, a.ctypes.data, 4000, 1)
    relu = rt.kernels.get_function(1, "relu_f32")
    rt.kernels.launch_kernel(relu, 2, rt.kernels.signature(relu).pack(x, y, 1000), 0)
    rt.sync.synchronize_stream(0)
    out = np.zeros(1000, np.float32)
    rt.memory.memcpy(out.ctypes.data, 4000, y, 4000, 2)
    assert np.array_equal(out, a)
    print(query("devices")["pid"], flush=True)
"""


@pytest.mark.multiprocess
def test_autostart_starts_exactly_one_daemon_that_exits_after_the_last_client(tmp_path):
    run_dir = tmp_path / "run"  # does not exist yet: the first client makes it
    address = f"unix://{run_dir}/simnpu.sock"  # the per-user default address of this runtime dir
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {
        "SIMNPU_ADDRESS": "",  # unset: the default address, where a daemon starts by itself
        "XDG_RUNTIME_DIR": str(run_dir),
        "SIMNPU_AUTOSTART": "",
        "SIMNPU_IDLE_EXIT": "1",
        "SIMNPU_MEMORY": "64MiB",
        "SIMNPU_LOG_LEVEL": "INFO",
    }
    code = AUTOSTARTED.format(barrier=str(barrier))
    processes = [start_client(address, code, env=env) for _ in range(3)]
    daemon_pid = None
    try:
        outputs = [process.communicate(timeout=120) for process in processes]
        for process, (out, err) in zip(processes, outputs):
            assert process.returncode == 0, err
        pids = {int(out) for out, _ in outputs}
        assert len(pids) == 1, f"the clients talked to different daemons: {pids}"
        daemon_pid = pids.pop()
        log = (run_dir / "simnpu-daemon.log").read_text()
        assert log.count(" serving ") == 1, log
        assert f"simnpu daemon {daemon_pid} serving" in log
        assert os.stat(run_dir).st_mode & 0o077 == 0
        # the daemon goes by itself a little after its last client, leaving nothing behind
        eventually(lambda: not alive(daemon_pid), timeout=30, what="the autostarted daemon exiting")
        assert not [n for n in simnpu_segments() if n.startswith(f"simnpu-{daemon_pid}-")]
        assert not (run_dir / "simnpu.sock").exists()
        assert "stopped" in (run_dir / "simnpu-daemon.log").read_text()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
        if daemon_pid is not None and alive(daemon_pid):
            for pid in children_of(daemon_pid) + [daemon_pid]:
                os.kill(pid, signal.SIGKILL)


def test_no_daemon_and_autostart_off_is_207004(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMNPU_AUTOSTART", "0")
    address = f"unix://{tmp_path}/nobody.sock"
    with pytest.raises(NpuError) as caught:
        Runtime(address)
    assert caught.value.code == codes.ACL_ERROR_RT_NO_DEVICE
    assert not (tmp_path / "nobody.sock").exists()
    result = run_client(
        address,
        """
        import simnpu.client as npu
        try:
            npu.Device(0)
        except npu.NpuError as error:
            print(error.code)
    """,
        env={"SIMNPU_AUTOSTART": "0"},
    )
    assert result.stdout.strip() == str(codes.ACL_ERROR_RT_NO_DEVICE), result.stderr
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".log")]


def test_only_an_in_stream_client_keeps_freed_memory_in_its_heap(daemon, monkeypatch):
    from simnpu.shm import heap

    calls = []
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: calls.append(True) or True)
    with runtime_of(daemon.address):
        assert calls == []
    monkeypatch.setenv("SIMNPU_NO_SHM", "1")
    with runtime_of(daemon.address) as rt:
        assert not rt.memory.uses_shared_memory
        assert calls == [True]
