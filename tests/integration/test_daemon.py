"""The daemon's lifecycle: signals, its socket, refusing to start, several devices, TCP with
a token, the health service, and supervision of its workers (death, timeout)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from conftest import round_trip, run_client, simnpu_segments, start_client
from grpc_health.v1 import health_pb2, health_pb2_grpc

from simnpu.client import autostart
from simnpu.client.runtime import Runtime
from simnpu.client.tools.query import query
from simnpu.proto import codes, commands, service
from simnpu.proto.errors import NpuError

H2D = codes.ACL_MEMCPY_HOST_TO_DEVICE
D2H = codes.ACL_MEMCPY_DEVICE_TO_HOST
MiB = 1 << 20

NAP = (
    "from simnpu import kernel\nimport time\n@kernel('f64')\n"
    "def nap(ctx, seconds):\n    time.sleep(seconds)\n"
)


def client(address: str, token: str | None = None) -> Runtime:
    rt = Runtime(address, token)
    rt.contexts.set_device(0)
    return rt


def within(seconds: float, rt: Runtime, call, *args):
    """call(*args) in a thread with `rt`'s current context: its result or exception, or a
    failure if it hangs."""
    outcome: list = []
    context = rt.contexts.get_context()

    def run() -> None:
        try:
            rt.contexts.set_context(context)
            outcome.append((True, call(*args)))
        except Exception as error:  # noqa: BLE001  (handed to the test's thread)
            outcome.append((False, error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{getattr(call, '__name__', call)} hung for {seconds} s"
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _code_of(call, *args):
    try:
        call(*args)
    except NpuError as error:
        return error.code
    return 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_daemon(*flags, env=None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a daemon expected to refuse to start: its exit code and output, and (the test
    checks) none of its segments left behind."""
    process = subprocess.Popen(
        [sys.executable, "-m", "simnpu.server", "--memory", "64MiB", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    left = [name for name in simnpu_segments() if name.startswith(f"simnpu-{process.pid}-")]
    assert not left, f"a daemon that did not start left {left} behind"
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


# ---- stopping ------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_daemon_cleanly_and_clients_are_told(start_daemon, sig):
    daemon = start_daemon()
    holder = client(daemon.address)  # owns memory, pinned memory and a stream
    holder.memory.malloc(16 * MiB)
    holder.host.malloc_host(MiB)
    holder.streams.create_stream()
    busy = client(daemon.address)  # a running kernel, more queued, and a blocked synchronize
    nap = busy.kernels.get_function(busy.kernels.binary_load(NAP), "nap")
    stream = busy.streams.create_stream()
    for _ in range(4):
        busy.kernels.launch_kernel(nap, 1, busy.kernels.signature(nap).pack(3.0), stream)
    fills = {
        rt: rt.kernels.get_function(commands.BUILTIN_BINARY, "fill_f32") for rt in (holder, busy)
    }
    buffers = {rt: rt.memory.malloc(64) for rt in (holder, busy)}
    blocked: list = []
    waiter = threading.Thread(
        target=lambda: blocked.append(_code_of(busy.sync.synchronize_stream, stream))
    )
    waiter.start()
    assert daemon.segments()
    try:
        assert daemon.stop(sig) == 0, daemon.output()  # segments and workers gone: checked there
        assert not os.path.exists(daemon.address[len("unix://") :])
        waiter.join(30)
        assert blocked and blocked[0] not in (None, 0), "a blocked synchronize was not told"
        for rt in (holder, busy):
            with pytest.raises(NpuError) as caught:
                within(10, rt, rt.memory.get_mem_info)
            assert caught.value.code == codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR
            args = rt.kernels.signature(fills[rt]).pack(buffers[rt], 1.0, 16)
            with pytest.raises(NpuError) as caught:  # asynchronous calls fail at once too
                within(10, rt, rt.kernels.launch_kernel, fills[rt], 1, args, 0)
            assert caught.value.code == codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR
    finally:
        holder.close()
        busy.close()


def test_a_stopped_daemon_leaves_a_client_process_an_error_not_a_hang(start_daemon):
    daemon = start_daemon()
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import sys, time
from simnpu.client.runtime import Runtime
from simnpu.proto.errors import NpuError
rt = Runtime({daemon.address!r})
rt.contexts.set_device(0)
rt.memory.malloc(1024)
print("ready", flush=True)
sys.stdin.readline()
try:
    rt.memory.malloc(1024)
except NpuError as error:
    print(error.code, flush=True)
""",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        assert daemon.stop(signal.SIGTERM) == 0
        out, err = process.communicate("go\n", timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert out.strip() == str(codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR), err


def test_a_daemon_stopped_while_a_session_ends_still_stops(start_daemon):
    """SIGTERM while a client that died is being cleaned up: its ring thread is still
    running the burst it left in its submission ring when the daemon releases it too (the
    daemon used to meet the ring's segment still in use, and never stopped)."""
    for _ in range(3):
        daemon = start_daemon()
        process = start_client(
            daemon.address,
            """
            import ctypes, sys
            import acl
            acl.init()
            acl.rt.set_device(0)
            stream, _ = acl.rt.create_stream()
            empty, _ = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "empty")
            no_args = ctypes.addressof(ctypes.create_string_buffer(1))
            for _ in range(120_000):  # fits in the ring: the daemon takes it all at once
                acl.rt.launch_kernel_with_host_args(empty, 1, stream, None, no_args, 0)
            print("sent", flush=True)
            sys.stdin.readline()
            """,
            stdin=True,
        )
        try:
            assert process.stdout.readline().strip() == "sent", process.stderr.read()
        finally:
            process.kill()
            process.communicate()
        assert daemon.stop(signal.SIGTERM) == 0, daemon.output()


# ---- the socket ----------------------------------------------------------------------------------
def test_socket_is_owner_only_in_a_private_directory(start_daemon, tmp_path):
    path = tmp_path / "deep" / "run" / "npu.sock"
    daemon = start_daemon(address=f"unix://{path}")
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) & 0o077 == 0, (
        "the socket's directory is open to others"
    )
    rt = client(daemon.address)
    round_trip(rt)
    rt.close()


def test_stale_socket_file_is_replaced(start_daemon, tmp_path):
    path = tmp_path / "stale" / "npu.sock"
    path.parent.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # the file a daemon that died leaves behind
    dead.close()
    assert path.exists() and not autostart.reachable(f"unix://{path}")
    daemon = start_daemon(address=f"unix://{path}")
    rt = client(daemon.address)
    round_trip(rt)
    rt.close()


def test_second_daemon_on_a_live_socket_refuses_to_start(daemon):
    result = run_daemon("--listen", daemon.address)
    assert result.returncode == 2, result.stderr
    assert "already listening" in result.stderr
    socket_path = daemon.address[len("unix://") :]
    assert os.path.exists(socket_path), "the refused daemon removed the running one's socket"
    rt = client(daemon.address)
    round_trip(rt)
    rt.close()


def test_memory_beyond_a_devices_address_space_is_a_clear_error(tmp_path):
    """Device memory costs nothing until allocated (docs/device-memory.md): what bounds
    --memory is the device's address space, not /dev/shm."""
    path = tmp_path / "big.sock"
    result = run_daemon("--listen", f"unix://{path}", "--memory", "10000GiB")
    assert result.returncode == 2
    assert "--memory must be from 1MiB to 512GiB" in result.stderr, result.stderr
    assert not path.exists()


def test_bad_flags_are_refused(tmp_path):
    for flags in (["--devices", "0"], ["--ai-cores", "0"], ["--memory", "12 apples"]):
        result = run_daemon("--listen", f"unix://{tmp_path}/x.sock", *flags)
        assert result.returncode == 2, (flags, result.stderr)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".sock")]


def test_a_synchronize_waiting_for_tasks_no_unit_started_is_told_the_daemon_stopped(
    start_daemon,
):
    """A kernel on device 1 waits for the device's workers, which start when the client
    first names it: when the daemon stops meanwhile, the task is dropped unrun, and a
    synchronize waiting on it is told, never answered with success. (Should the kernel be
    running by then, the answer is the same.)"""
    daemon = start_daemon("--devices", "2")
    rt = Runtime(daemon.address)
    rt.contexts.set_device(1)
    nap = rt.kernels.get_function(rt.kernels.binary_load(NAP), "nap")
    stream = rt.streams.create_stream()
    rt.kernels.launch_kernel(nap, 1, rt.kernels.signature(nap).pack(5.0), stream)
    blocked: list = []
    waiter = threading.Thread(
        target=lambda: blocked.append(_code_of(rt.sync.synchronize_stream, stream))
    )
    waiter.start()
    assert daemon.stop() == 0, daemon.output()
    waiter.join(30)
    assert blocked == [codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR]
    rt.close()


# ---- several devices -----------------------------------------------------------------------------
def test_two_devices(start_daemon):
    daemon = start_daemon("--devices", "2")
    rt = Runtime(daemon.address)
    try:
        assert rt.contexts.get_device_count() == 2
        addresses = {}
        for device in (0, 1):
            rt.contexts.set_device(device)
            assert rt.contexts.get_device() == device
            assert rt.memory.get_mem_info() == (256 * MiB, 256 * MiB)
            round_trip(rt)
            addresses[device] = rt.memory.malloc(8 * MiB)
            assert rt.memory.get_mem_info()[0] < 256 * MiB - 8 * MiB + 1
        assert addresses[1] - addresses[0] >= 1 << 40  # separate address spaces
        rt.contexts.set_device(0)
        assert rt.memory.get_mem_info()[0] <= 248 * MiB
        with pytest.raises(NpuError) as caught:
            rt.contexts.set_device(2)
        assert caught.value.code == codes.ACL_ERROR_RT_INVALID_DEVICEID
        devices = query("devices", address=daemon.address)["devices"]
        assert [d["index"] for d in devices] == [0, 1]
        assert all(d["ai_cores"] == 2 for d in devices)
    finally:
        rt.close()
    assert len(daemon.segments()) == 2


# ---- TCP and the token ---------------------------------------------------------------------------
def test_tcp_without_a_token_refuses_to_start(monkeypatch):
    monkeypatch.delenv("SIMNPU_TOKEN", raising=False)
    result = run_daemon("--listen", f"127.0.0.1:{free_port()}")
    assert result.returncode == 2
    assert "token" in result.stderr.lower(), result.stderr


def test_second_daemon_on_a_taken_tcp_port_refuses_to_start(start_daemon):
    """gRPC would share the port (SO_REUSEPORT) and split the clients between the two."""
    address = f"127.0.0.1:{free_port()}"
    token = {"SIMNPU_TOKEN": "s3cret-token"}
    start_daemon(address=address, env=token)
    result = run_daemon("--listen", address, env=token)
    assert result.returncode == 2, result.stderr
    assert f"cannot start the daemon: Failed to bind to address {address}" in result.stderr
    rt = client(address, token="s3cret-token")  # the first one still serves
    round_trip(rt)
    rt.close()


def test_a_client_connects_at_once_while_another_channel_to_its_address_backs_off(
    start_daemon,
):
    """gRPC shares one connection per address and channel options across a process: a
    new client used to get the connection of an older channel of the process to the same
    address, still backing off after nobody listened there, and its calls failed at once
    (UNAVAILABLE, "Connection refused") although a daemon listened there by then."""
    address = f"127.0.0.1:{free_port()}"
    older = grpc.insecure_channel(address, options=service.CLIENT_CHANNEL_OPTIONS)
    try:
        ask = older.unary_unary(service.QUERY_METHOD)
        with pytest.raises(grpc.RpcError) as nobody:  # connects, is refused, backs off...
            ask(b"", timeout=3, wait_for_ready=True)
        assert nobody.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        start_daemon(address=address, env={"SIMNPU_TOKEN": "s3cret-token"})
        rt = client(address, token="s3cret-token")  # ...while a daemon comes up there
        round_trip(rt)
        rt.close()
    finally:
        older.close()


def test_once_its_unix_socket_accepts_a_daemon_listens_on_its_tcp_address(tmp_path):
    """A Unix socket accepts from its bind on; the daemon used to bind its TCP address after
    it, so a client that found the Unix socket accepting -- as the tests' and the tools'
    readiness probes do -- could be refused on the TCP address for a moment."""
    for attempt in range(5):
        path = tmp_path / f"npu{attempt}.sock"
        port = free_port()
        daemon = subprocess.Popen(
            [
                sys.executable, "-m", "simnpu.server", "--memory", "64MiB",
                "--listen", f"unix://{path}", "--listen", f"127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "SIMNPU_TOKEN": "s3cret-token"},
        )  # fmt: skip
        try:
            while True:  # the first moment its Unix socket accepts
                with socket.socket(socket.AF_UNIX) as probe:
                    try:
                        probe.connect(str(path))
                        break
                    except OSError:
                        assert daemon.poll() is None, daemon.communicate()[1]
            with socket.socket() as tcp:
                tcp.connect(("127.0.0.1", port))  # refused while the daemon did not listen
        finally:
            daemon.terminate()
            assert daemon.wait(60) == 0, daemon.communicate()[1]
        left = [name for name in simnpu_segments() if name.startswith(f"simnpu-{daemon.pid}-")]
        assert not left, left


def test_tcp_needs_the_right_token(start_daemon, monkeypatch):
    monkeypatch.delenv("SIMNPU_TOKEN", raising=False)
    address = f"127.0.0.1:{free_port()}"
    daemon = start_daemon(address=address, env={"SIMNPU_TOKEN": "s3cret-token"})
    rt = client(address, token="s3cret-token")
    round_trip(rt)
    for token in ("wrong", "s3cret-tokeN", "s3cret-token "):
        with pytest.raises(NpuError) as caught:
            Runtime(address, token)
        assert caught.value.code == codes.ACL_ERROR_RT_NO_PERMISSION
        assert "token" in caught.value.message
    with pytest.raises(NpuError) as caught:
        Runtime(address)  # no token at all
    assert caught.value.code == codes.ACL_ERROR_RT_NO_PERMISSION
    result = run_client(
        address,
        "import simnpu.client as npu; npu.Device(0); print('in')",
        env={"SIMNPU_TOKEN": "s3cret-token"},
    )
    assert result.stdout.strip() == "in", result.stderr
    round_trip(rt)  # the refused clients changed nothing for the accepted one
    rt.close()
    assert daemon.segments()


def test_in_stream_copies_over_tcp_with_the_token(start_daemon, monkeypatch):
    """A client that cannot map the daemon's memory, over TCP: the chunks of its pageable
    copies ride in the token-checked stream, synchronous and stream-ordered alike."""
    monkeypatch.delenv("SIMNPU_TOKEN", raising=False)
    address = f"127.0.0.1:{free_port()}"
    start_daemon(address=address, env={"SIMNPU_TOKEN": "s3cret-token"})
    monkeypatch.setenv("SIMNPU_NO_SHM", "1")
    rt = client(address, token="s3cret-token")
    assert not rt.memory.uses_shared_memory
    size = 20 * MiB + 5  # several chunks
    data = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
    device, stream = rt.memory.malloc(size), rt.streams.create_stream()
    for ordered in (False, True):
        out = np.zeros(size, np.uint8)
        rt.memory.memset(device, size, 0, size)
        if ordered:
            rt.memory.memcpy_async(device, size, data.ctypes.data, size, H2D, stream)
            rt.memory.memcpy_async(out.ctypes.data, size, device, size, D2H, stream)
            rt.sync.synchronize_stream(stream)
        else:
            rt.memory.memcpy(device, size, data.ctypes.data, size, H2D)
            rt.memory.memcpy(out.ctypes.data, size, device, size, D2H)
        assert np.array_equal(out, data), f"ordered={ordered}"
    rt.streams.destroy_stream(stream)
    rt.memory.free(device)
    rt.close()


# ---- the health service --------------------------------------------------------------------------
def test_health_service_reports_serving(daemon):
    with grpc.insecure_channel(daemon.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", service.SERVICE):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=30)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


# ---- supervision of workers ----------------------------------------------------------------------
CRASHERS = {
    "os._exit": (
        "from simnpu import kernel\nimport os\n@kernel()\ndef crash(ctx):\n    os._exit(1)\n"
    ),
    "SIGKILL": (
        "from simnpu import kernel\nimport os\n@kernel()\n"
        "def crash(ctx):\n    os.kill(os.getpid(), 9)\n"
    ),
}


def restarts(daemon) -> int:
    return query("devices", address=daemon.address)["devices"][0]["worker_restarts"]


@pytest.mark.parametrize("how", CRASHERS)
def test_a_dying_ai_core_fails_its_task_and_is_replaced(daemon, how):
    rt, other = client(daemon.address), client(daemon.address)
    try:
        before = restarts(daemon)
        other_nap = other.kernels.get_function(other.kernels.binary_load(NAP), "nap")
        other_stream = other.streams.create_stream()
        other.kernels.launch_kernel(
            other_nap, 1, other.kernels.signature(other_nap).pack(0.3), other_stream
        )
        crash = rt.kernels.get_function(rt.kernels.binary_load(CRASHERS[how]), "crash")
        stream = rt.streams.create_stream()
        rt.kernels.launch_kernel(crash, 1, b"", stream)
        with pytest.raises(NpuError) as caught:
            within(60, rt, rt.sync.synchronize_stream, stream)
        assert caught.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
        assert "replaced" in caught.value.message
        assert restarts(daemon) == before + 1
        within(60, rt, rt.sync.synchronize_stream, stream)  # reported once
        within(
            60, other, other.sync.synchronize_stream, other_stream
        )  # the other client saw nothing
        for _ in range(3):  # both cores, the new one included, work
            within(60, rt, round_trip, rt)
            within(60, other, round_trip, other)
        rt.streams.destroy_stream(stream)
        other.streams.destroy_stream(other_stream)
    finally:
        rt.close()
        other.close()


def test_a_kernel_over_the_op_timeout_fails_with_507014_and_its_core_is_replaced(daemon):
    rt, other = client(daemon.address), client(daemon.address)
    try:
        before = restarts(daemon)
        rt.kernels.set_op_execute_timeout(300)
        nap = rt.kernels.get_function(rt.kernels.binary_load(NAP), "nap")
        other_nap = other.kernels.get_function(other.kernels.binary_load(NAP), "nap")
        stream, other_stream = rt.streams.create_stream(), other.streams.create_stream()
        rt.kernels.launch_kernel(nap, 1, rt.kernels.signature(nap).pack(5.0), stream)
        # the timeout is this process's: the other client's slower kernel is not cut short
        other.kernels.launch_kernel(
            other_nap, 1, other.kernels.signature(other_nap).pack(0.6), other_stream
        )
        with pytest.raises(NpuError) as caught:
            within(30, rt, rt.sync.synchronize_stream, stream)
        assert caught.value.code == codes.ACL_ERROR_RT_AICORE_TIMEOUT
        within(30, other, other.sync.synchronize_stream, other_stream)
        assert restarts(daemon) == before + 1
        rt.kernels.set_op_execute_timeout(0)  # back to the daemon's default
        for _ in range(3):
            within(60, rt, round_trip, rt)
            within(60, other, round_trip, other)
        rt.kernels.launch_kernel(nap, 2, rt.kernels.signature(nap).pack(0.4), stream)
        within(30, rt, rt.sync.synchronize_stream, stream)
        rt.streams.destroy_stream(stream)
        other.streams.destroy_stream(other_stream)
    finally:
        rt.close()
        other.close()


def test_calls_racing_the_daemons_end_all_get_an_error(start_daemon):
    """Threads issuing requests while the daemon stops: every one ends with an NpuError,
    none waits forever for a reply that cannot come."""
    daemon = start_daemon()
    rt = client(daemon.address)
    context = rt.contexts.get_context()
    ended: list = []
    started = threading.Barrier(9)

    def hammer() -> None:
        rt.contexts.set_context(context)
        started.wait()
        try:
            while True:
                rt.memory.get_mem_info()
        except NpuError as error:
            ended.append(error.code)

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so that the race windows get hit
    try:
        for thread in threads:
            thread.start()
        started.wait()
        time.sleep(0.2)
        assert daemon.stop(signal.SIGTERM) == 0
        for thread in threads:
            thread.join(15)
        assert len(ended) == 8, f"{8 - len(ended)} call(s) never returned after the daemon stopped"
    finally:
        sys.setswitchinterval(interval)
        rt.close()
