"""One HCCL world over two daemons (docs/multihost.md): two real daemons on this machine,
each with its own devices, shared memory and exchange processes, joined over loopback TCP;
rank processes of each daemon's own."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import threading
import time

import pytest
from conftest import DaemonProcess
from hccl_ranks import assert_all_ok, run_ranks

from simnpu.server.hccl.root_infos import ROOT_LAYOUT

pytest.importorskip("torch", reason="the multihost extra (torch) is not installed")

TOKEN = secrets.token_hex(16)


def free_port(family: socket.AddressFamily = socket.AF_INET) -> int:
    with socket.socket(family) as probe:
        probe.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        return probe.getsockname()[1]


def start_host(directory, loopback: str = "127.0.0.1") -> DaemonProcess:
    """A daemon listening on loopback TCP (`loopback`: 127.0.0.1, or [::1]) and advertising
    that address (`.advertised`)."""
    port = free_port(socket.AF_INET6 if loopback.startswith("[") else socket.AF_INET)
    address = f"{loopback}:{port}"
    daemon = DaemonProcess(
        directory,
        "--listen",
        address,
        "--advertise",
        address,
        "--devices",
        "2",
        "--memory",
        "128MiB",
        env={"SIMNPU_TOKEN": TOKEN},
    )
    daemon.advertised = address  # type: ignore[attr-defined]
    return daemon


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Two daemons, "hosts" a and b, 2 devices each."""
    started = []
    try:
        for name in ("a", "b"):
            started.append(start_host(tmp_path_factory.mktemp(f"host-{name}")))
        yield started
    finally:
        for daemon in started:
            assert daemon.stop() == 0, daemon.output()


def run_world(hosts, layout, body, tmp_path, **kwargs):
    """Run len(ranks) rank processes; layout[h] lists the ranks of daemon h, in order of
    their devices. Rank 0 issues the root info on its daemon."""
    n = sum(len(ranks) for ranks in layout)
    devices, rank_env = [0] * n, {}
    for daemon, ranks in zip(hosts, layout):
        for device, rank in enumerate(ranks):
            devices[rank] = device
            rank_env[rank] = {"SIMNPU_ADDRESS": daemon.address}
    host_order = sorted((sorted(ranks) for ranks in layout if ranks), key=lambda r: r[0])
    env = {"HCCL_TEST_HOSTS": json.dumps(host_order), **kwargs.pop("env", {})}
    return run_ranks(
        hosts[0].address, n, body, tmp_path, devices=devices, rank_env=rank_env, env=env, **kwargs
    )


DATA = """
import ml_dtypes

HOSTS = json.loads(os.environ["HCCL_TEST_HOSTS"])  # each host's ranks, in host order
UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def dtype_of(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def data(case, rank, count, dtype):
    rng = np.random.default_rng(case * 1000 + rank)
    if dtype.kind == "f" or dtype == dtype_of("bfloat16"):
        return (rng.standard_normal(count) * 50).astype(dtype)
    return rng.integers(-100, 100, count).astype(dtype)


def in_order(op, arrays):
    with np.errstate(all="ignore"):
        result = arrays[0].copy()
        for array in arrays[1:]:
            result = UFUNCS[op](result, array).astype(arrays[0].dtype)
    return result


def across_hosts(op, arrays):
    \"\"\"docs/multihost.md's order: each host's ranks in rank order, then the hosts in order.\"\"\"
    return in_order(op, [in_order(op, [arrays[r] for r in ranks]) for ranks in HOSTS])
"""

EVERY_COLLECTIVE = (
    DATA
    + """
comm = Communicator(N, exchange_root_info(), RANK)
assert (comm.rank, comm.size) == (RANK, N)
stream = npu.Stream()
checks, keep = [], []


def device(array):
    keep.append(npu.DeviceBuffer.from_array(array))
    return keep[-1]


def empty(count, dtype):
    keep.append(npu.DeviceBuffer(max(1, count * dtype.itemsize)))
    return keep[-1]


case = 0
for name in ["float32", "bfloat16", "int32", "float64"]:
    dt = dtype_of(name)
    count = 1000 + 37 * case
    for op in ["sum", "max"]:
        case += 1
        recv = empty(count, dt)
        comm.all_reduce(device(data(case, RANK, count, dt)), recv, op, dtype=dt, stream=stream)
        checks.append((recv, across_hosts(op, [data(case, r, count, dt) for r in range(N)])))
    case += 1
    recv = empty(count * N, dt)
    comm.all_gather(device(data(case, RANK, count, dt)), recv, dtype=dt, stream=stream)
    checks.append((recv, np.concatenate([data(case, r, count, dt) for r in range(N)])))
    case += 1
    recv = empty(count, dt)
    comm.reduce_scatter(device(data(case, RANK, count * N, dt)), recv, "sum", dtype=dt,
                        stream=stream)
    total = across_hosts("sum", [data(case, r, count * N, dt) for r in range(N)])
    checks.append((recv, total[RANK * count:(RANK + 1) * count]))
    case += 1
    root = case % N
    buffer = device(data(case, RANK, count, dt))
    comm.broadcast(buffer, root, dtype=dt, stream=stream)
    checks.append((buffer, data(case, root, count, dt)))
    case += 1
    root = (case + 1) % N
    recv = empty(count, dt)
    comm.reduce(device(data(case, RANK, count, dt)), recv, "min", root, dtype=dt, stream=stream)
    if RANK == root:
        checks.append((recv, across_hosts("min", [data(case, r, count, dt) for r in range(N)])))
    case += 1
    root = (case + 2) % N
    recv = empty(count, dt)
    comm.scatter(device(data(case, RANK, count * N, dt)), recv, root, dtype=dt, stream=stream)
    checks.append((recv, data(case, root, count * N, dt)[RANK * count:(RANK + 1) * count]))
    case += 1
    recv = empty(count * N, dt)
    comm.alltoall(device(data(case, RANK, count * N, dt)), recv, dtype=dt, stream=stream)
    pieces = [data(case, r, count * N, dt)[RANK * count:(RANK + 1) * count] for r in range(N)]
    checks.append((recv, np.concatenate(pieces)))
    case += 1  # a ring: even ranks send first, odd ranks receive first
    recv = empty(count, dt)
    after, before = (RANK + 1) % N, (RANK - 1) % N
    sent = device(data(case, RANK, count, dt))
    for turn in ([0, 1] if RANK % 2 == 0 else [1, 0]):
        if turn == 0:
            comm.send(sent, after, dtype=dt, stream=stream)
        else:
            comm.recv(recv, before, dtype=dt, stream=stream)
    checks.append((recv, data(case, before, count, dt)))
    comm.barrier(stream)

stream.synchronize()
for index, (buffer, expected) in enumerate(checks):
    got = buffer.to_numpy(expected.dtype)[:expected.size]
    assert got.tobytes() == expected.tobytes(), (index, expected.dtype, got[:8], expected[:8])
assert comm.async_error() is None
report(checked=len(checks))
comm.destroy()
"""
)


@pytest.mark.parametrize("layout", [[[0, 1], [2, 3]], [[0, 2], [3, 1]]], ids=["blocks", "mixed"])
def test_every_collective_across_two_hosts_in_the_documented_order(hosts, layout, tmp_path):
    results = run_world(hosts, layout, EVERY_COLLECTIVE, tmp_path)
    assert_all_ok(results)
    assert all(r.values["checked"] > 0 for r in results)


KILLED_MID_COLLECTIVE = """
marks = os.environ["MARK_DIR"]


def mark(name):
    open(os.path.join(marks, name), "w").close()


comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
x = npu.DeviceBuffer.from_array(np.full(4096, RANK, np.float32))
y = npu.DeviceBuffer(x.nbytes)
if os.environ["SIMNPU_ADDRESS"] != os.environ["SURVIVOR"]:  # the host about to be killed
    mark(f"formed-{RANK}")
    while not os.path.exists(os.path.join(marks, "killed")):
        time.sleep(0.01)
    os._exit(0)
comm.all_reduce(x, y, "sum", dtype=np.float32, stream=stream)  # the others never come
side = npu.Stream()
inbox = npu.DeviceBuffer(x.nbytes)
comm.recv(inbox, RANK + 2, dtype=np.float32, stream=side)  # from the doomed host: never sent
mark(f"submitted-{RANK}")
report_synchronize(stream, comm)
try:
    side.synchronize()
    report(recv_code=0)
except NpuError as error:
    report(recv_code=error.code, recv_message=error.message)
comm.destroy()
# this daemon still serves: a new communicator of its own ranks works
pair = Communicator(2, exchange_root_info("root_info_again"), RANK)
pair.all_reduce(x, y, "sum", dtype=np.float32, stream=stream)
stream.synchronize()
report(after=float(y.to_numpy(np.float32)[0]))
pair.destroy()
"""


def test_a_host_killed_mid_collective_fails_the_others_by_name_and_the_survivor_serves_on(
    hosts, tmp_path
):
    survivor = hosts[0]
    (tmp_path / "doomed").mkdir()
    doomed = start_host(tmp_path / "doomed")
    marks = tmp_path / "marks"
    marks.mkdir()
    outcome: list = []

    def ranks() -> None:
        outcome.append(
            run_world(
                [survivor, doomed],
                [[0, 1], [2, 3]],
                KILLED_MID_COLLECTIVE,
                tmp_path,
                env={"MARK_DIR": str(marks), "SURVIVOR": survivor.address},
            )
        )

    runner = threading.Thread(target=ranks)
    runner.start()
    deadline = time.monotonic() + 60
    wanted = ["formed-2", "formed-3", "submitted-0", "submitted-1"]
    while not all((marks / name).exists() for name in wanted) and time.monotonic() < deadline:
        time.sleep(0.02)
    doomed.stop(signal.SIGKILL)
    (marks / "killed").touch()
    runner.join(120)
    results = outcome[0]
    assert_all_ok(results)
    for result in results[:2]:
        values = result.values
        assert values["code"] == 507904, values  # ACL_ERROR_RT_COMM_OP_RETRY_FAIL
        assert f"lost host {doomed.advertised} (ranks 2, 3)" in values["message"], values
        assert values["async_error"] == 21, values  # HCCL_E_REMOTE
        assert values["recv_code"] == 507904, values  # the recv in flight in the exchange too
        assert f"lost host {doomed.advertised} (ranks 2, 3)" in values["recv_message"], values
        assert values["after"] == 1.0, values  # 0 + 1 over the pair


ISSUE = """
info, ret = hccl.get_root_info()
assert ret == hccl.HCCL_SUCCESS, ret
with open(os.environ["ROOT_FILE"], "wb") as handle:
    handle.write(info)
"""

JOIN = """
with open(os.environ["ROOT_FILE"], "rb") as handle:
    info = handle.read()
try:
    Communicator(2, info, 1)
    report(code=0)
except NpuError as error:
    report(code=error.code, message=error.message)
"""


def root_info_file(daemon, tmp_path, name: str) -> str:
    """A root info issued by `daemon` (its issuer has ended: nobody can join it there)."""
    path = str(tmp_path / name)
    assert_all_ok(run_ranks(daemon.address, 1, ISSUE, tmp_path, env={"ROOT_FILE": path}))
    return path


def join_with(daemon, path: str, tmp_path) -> dict:
    results = run_ranks(daemon.address, 1, JOIN, tmp_path, env={"ROOT_FILE": path})
    assert_all_ok(results)
    return results[0].values


def test_joins_that_cannot_reach_a_world_fail_with_hccl_codes(
    hosts, daemon, start_daemon, tmp_path
):
    a = hosts[0]
    # a daemon that advertises no address: its root info cannot be joined from elsewhere
    values = join_with(a, root_info_file(daemon, tmp_path, "plain"), tmp_path)
    assert values["code"] == 1 and "advertises no address" in values["message"], values
    # a rank of a daemon without --advertise cannot join a world elsewhere
    values = join_with(daemon, root_info_file(a, tmp_path, "from-a"), tmp_path)
    assert values["code"] == 1 and "only with --advertise" in values["message"], values
    # a daemon with another token is refused by the root info's daemon
    port = free_port()
    stranger = start_daemon("--listen", f"127.0.0.1:{port}", env={"SIMNPU_TOKEN": "another-token"})
    values = join_with(stranger, root_info_file(a, tmp_path, "from-a-2"), tmp_path)
    assert values["code"] == 11, values  # HCCL_E_TCP_CONNECT
    assert a.advertised in values["message"] and "token" in values["message"], values
    # the root info's daemon is gone
    gone_dir = tmp_path / "gone"
    gone_dir.mkdir()
    gone = start_host(gone_dir)
    path = root_info_file(gone, tmp_path, "from-gone")
    gone.stop()
    values = join_with(a, path, tmp_path)
    assert values["code"] == 11 and gone.advertised in values["message"], values
    # the daemons serve on: a world of a and b still forms and runs
    assert_all_ok(run_world(hosts, [[0], [1]], EVERY_COLLECTIVE, tmp_path))


MISSING_RANK = """
try:  # process 0 is rank 0 (on host a), process 1 rank 2 (on host b): rank 1 never comes
    Communicator(3, exchange_root_info(), [0, 2][RANK])
    report(code=0)
except NpuError as error:
    report(code=error.code, message=error.message)
"""


def test_a_rank_that_never_joins_times_the_world_out_on_every_host(hosts, tmp_path):
    results = run_world(
        hosts, [[0], [1]], MISSING_RANK, tmp_path, env={"HCCL_CONNECT_TIMEOUT": "2"}
    )
    assert_all_ok(results)
    for result in results:
        values = result.values
        assert values["code"] == 9, values  # HCCL_E_TIMEOUT
        assert "rank 1 of 3 never joined" in values["message"], values


EVERY_TYPE_AND_OP = (
    DATA
    + """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
checks, keep, case, count = [], [], 0, 257


def device(array):
    keep.append(npu.DeviceBuffer.from_array(array))
    return keep[-1]


def empty(elements, dt):
    keep.append(npu.DeviceBuffer(elements * dt.itemsize))
    return keep[-1]


def inputs(elements, dt):
    return [data(case, r, elements, dt) for r in range(N)]


for name in ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "float32", "float64", "bfloat16"]:
    dt = dtype_of(name)
    for op in ["sum", "prod", "max", "min"]:
        case += 1
        recv = empty(count, dt)
        comm.all_reduce(device(data(case, RANK, count, dt)), recv, op, dtype=dt, stream=stream)
        checks.append((recv, across_hosts(op, inputs(count, dt))))
        case += 1
        recv = empty(count, dt)
        comm.reduce_scatter(device(data(case, RANK, count * N, dt)), recv, op, dtype=dt,
                            stream=stream)
        checks.append((recv, across_hosts(op, inputs(count * N, dt))[RANK * count:][:count]))
        case += 1
        root = case % N
        recv = empty(count, dt)
        comm.reduce(device(data(case, RANK, count, dt)), recv, op, root, dtype=dt, stream=stream)
        if RANK == root:
            checks.append((recv, across_hosts(op, inputs(count, dt))))
    case += 1
    recv = empty(count * N, dt)
    comm.all_gather(device(data(case, RANK, count, dt)), recv, dtype=dt, stream=stream)
    checks.append((recv, np.concatenate(inputs(count, dt))))
    case += 1
    buffer = device(data(case, RANK, count, dt))
    comm.broadcast(buffer, case % N, dtype=dt, stream=stream)
    checks.append((buffer, data(case, case % N, count, dt)))
    case += 1
    recv = empty(count, dt)
    comm.scatter(device(data(case, RANK, count * N, dt)), recv, case % N, dtype=dt, stream=stream)
    checks.append((recv, data(case, case % N, count * N, dt)[RANK * count:][:count]))
    case += 1
    recv = empty(count * N, dt)
    comm.alltoall(device(data(case, RANK, count * N, dt)), recv, dtype=dt, stream=stream)
    checks.append((recv, np.concatenate([a[RANK * count:][:count] for a in inputs(count * N, dt)])))
    case += 1
    if RANK < 2:  # ranks 0 and 1 are on different hosts: 0 sends, 1 receives
        buffer = device(data(case, RANK, count, dt))
        if RANK == 0:
            comm.send(buffer, 1, dtype=dt, stream=stream)
        else:
            comm.recv(buffer, 0, dtype=dt, stream=stream)
            checks.append((buffer, data(case, 0, count, dt)))
stream.synchronize()
for buffer, expected in checks:
    got = buffer.to_numpy(expected.dtype)[:expected.size]
    assert got.tobytes() == expected.tobytes(), (expected.dtype, got[:8], expected[:8])
report(checked=len(checks))
comm.destroy()
"""
)


def test_every_collective_and_send_recv_of_every_type_and_op_across_hosts(hosts, tmp_path):
    results = run_world(hosts, [[0, 2], [1]], EVERY_TYPE_AND_OP, tmp_path)
    assert_all_ok(results)
    # each rank, per type: all_reduce and reduce_scatter for each of 4 ops and 4 movements;
    # the 48 reduces are checked at their roots, the 12 recvs at rank 1
    checked = [r.values["checked"] for r in results]
    assert min(checked) >= 12 * 12 and sum(checked) == 3 * 12 * 12 + 48 + 12, checked


NEVER_CALLED = """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
x = npu.DeviceBuffer.from_array(np.ones(1024, np.float32))
y = npu.DeviceBuffer(x.nbytes)
first = os.environ["SIMNPU_ADDRESS"] == os.environ["FIRST"]
if not first:  # this host's ranks come only after the others have given up
    wait_for("gave-up-0")
    wait_for("gave-up-1")
comm.all_reduce(x, y, "sum", dtype=np.float32, stream=stream)
report_synchronize(stream, comm)
if first:
    open(os.path.join(DIR, f"gave-up-{RANK}"), "w").close()
comm.destroy()
"""


def test_a_host_that_never_calls_times_the_collective_out_naming_it(hosts, tmp_path):
    a, b = hosts
    env = {"FIRST": a.address, "HCCL_EXEC_TIMEOUT": "3"}
    results = run_world(hosts, [[0, 1], [2, 3]], NEVER_CALLED, tmp_path, env=env)
    assert_all_ok(results)
    for result in results[:2]:  # host a's ranks
        values = result.values
        assert values["code"] == 107020, values  # ACL_ERROR_RT_TASK_TIMEOUT
        assert values["async_error"] == 9, values  # HCCL_E_TIMEOUT
        message = values["message"]
        assert "collective #0" in message and "HCCL_EXEC_TIMEOUT (3 s)" in message, values
        assert f"host {b.advertised} (ranks 2, 3) did not take part" in message, values
    for result in results[2:]:  # host b's, arriving at a world broken by the timeout
        values = result.values
        assert values["code"] in (107020, 507904), values
        assert f"host {b.advertised} (ranks 2, 3) did not take part" in values["message"], values


TWO_WORLDS = """
first = Communicator(N, exchange_root_info(), RANK)
# the second world's rank 0 is the last rank, on the other host
second = Communicator(N, exchange_root_info("root_info_2", issuer=N - 1), N - 1 - RANK)
streams = [npu.Stream(), npu.Stream()]
if os.environ["SIMNPU_ADDRESS"] != os.environ["FIRST"]:
    time.sleep(1.5)  # a late host: the others wait for it, within HCCL_EXEC_TIMEOUT
checks, keep = [], []
for round in range(4):
    for index, comm in enumerate((first, second)):
        value = 100 * round + 10 * index + comm.rank
        keep.append(npu.DeviceBuffer.from_array(np.full(4096, value, np.int64)))
        keep.append(npu.DeviceBuffer(keep[-1].nbytes))
        comm.all_reduce(keep[-2], keep[-1], "sum", dtype=np.int64, stream=streams[index])
        checks.append((keep[-1], sum(100 * round + 10 * index + r for r in range(N))))
for stream in streams:
    stream.synchronize()
for buffer, expected in checks:
    assert (buffer.to_numpy(np.int64) == expected).all(), (buffer.to_numpy(np.int64)[:4], expected)
assert first.async_error() is None and second.async_error() is None
report(checked=len(checks), ranks=[first.rank, second.rank])
first.destroy()
second.destroy()
"""


def test_two_worlds_at_once_share_the_daemons_and_wait_for_a_late_host(hosts, tmp_path):
    a, _ = hosts
    results = run_world(hosts, [[0, 1], [2, 3]], TWO_WORLDS, tmp_path, env={"FIRST": a.address})
    assert_all_ok(results)
    assert [r.values["ranks"] for r in results] == [[0, 3], [1, 2], [2, 1], [3, 0]]
    assert all(r.values["checked"] == 8 for r in results)


SEND_RECV_DIFFER = """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
x = npu.DeviceBuffer(1024)
if RANK == 0:
    comm.send(x, 1, count=64, dtype=np.float32, stream=stream)
else:
    comm.recv(x, 0, count=128, dtype=np.float32, stream=stream)
try:
    stream.synchronize()
    report(code=0)
except NpuError as error:
    report(code=error.code, message=error.message)
comm.destroy()
"""


def test_a_send_and_recv_that_differ_between_hosts_fail_both_naming_each_call(hosts, tmp_path):
    a, b = hosts
    results = run_world(hosts, [[0], [1]], SEND_RECV_DIFFER, tmp_path)
    assert_all_ok(results)
    for result in results:
        values = result.values
        assert values["code"] == 107000, values  # HCCL_E_PARA
        message = values["message"]
        assert "mismatch between hosts at send/recv #0 from rank 0 to rank 1" in message, values
        assert f"host {a.advertised} (rank 0): rank 0 called send(count=64" in message, values
        assert f"host {b.advertised} (rank 1): rank 1 called recv(count=128" in message, values


BESIDE_A_COLLECTIVE = """
comm = Communicator(N, exchange_root_info(), RANK)
streams = [npu.Stream(), npu.Stream()]
x = npu.DeviceBuffer.from_array(np.full(1 << 16, RANK + 1, np.float32))
y = npu.DeviceBuffer(x.nbytes)
message = npu.DeviceBuffer.from_array(np.arange(1 << 16, dtype=np.float32) * (RANK + 1))
got = npu.DeviceBuffer(message.nbytes)
if RANK == 0:  # its host's all_reduce waits for rank 2's, which waits for this send
    comm.all_reduce(x, y, "sum", dtype=np.float32, stream=streams[0])
    time.sleep(0.5)
    comm.send(message, 2, dtype=np.float32, stream=streams[1])
elif RANK == 2:
    comm.recv(got, 0, dtype=np.float32, stream=streams[0])
    comm.all_reduce(x, y, "sum", dtype=np.float32, stream=streams[0])
else:
    comm.all_reduce(x, y, "sum", dtype=np.float32, stream=streams[0])
for stream in streams:
    stream.synchronize()
assert (y.to_numpy(np.float32) == sum(range(1, N + 1))).all()
if RANK == 2:
    assert np.array_equal(got.to_numpy(np.float32), np.arange(1 << 16, dtype=np.float32))
report(ok=True)
comm.destroy()
"""


def test_a_send_between_hosts_runs_beside_a_collective_that_waits_for_it(hosts, tmp_path):
    # (a send that waited behind the collective would fail it after HCCL_EXEC_TIMEOUT)
    env = {"HCCL_EXEC_TIMEOUT": "20"}
    results = run_world(hosts, [[0, 1], [2, 3]], BESIDE_A_COLLECTIVE, tmp_path, env=env)
    assert_all_ok(results)
    assert all(r.values["ok"] for r in results)


ONE_ALL_REDUCE = """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
x = npu.DeviceBuffer.from_array(np.arange(4096, dtype=np.int32) * (RANK + 1))
comm.all_reduce(x, x, "sum", dtype=np.int32, stream=stream)
stream.synchronize()
assert np.array_equal(x.to_numpy(np.int32), np.arange(4096, dtype=np.int32) * 10)
report(ok=True)
comm.destroy()
"""


@pytest.mark.skipif(not os.path.exists("/proc/net/if_inet6"), reason="no IPv6 on this machine")
def test_a_world_forms_and_reduces_over_ipv6(tmp_path):
    """Daemons that listen on and advertise [::1]: the exchange processes find the interface
    of an IPv6 address too."""
    started = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            started.append(start_host(tmp_path / name, "[::1]"))
        results = run_world(started, [[0, 1], [2, 3]], ONE_ALL_REDUCE, tmp_path)
        assert_all_ok(results)
        assert all(r.values["ok"] for r in results)
    finally:
        for daemon in started:
            assert daemon.stop() == 0, daemon.output()


def _peer_call(address: str, messages: list, token: str | None = TOKEN) -> list:
    """Send raw messages (bytes) on a Peer stream; what comes back, or the RPC error."""
    import grpc

    from simnpu.proto import service

    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(f"/{service.SERVICE}/Peer")
        metadata = ((service.TOKEN_METADATA_KEY, token),) if token else ()
        try:
            return list(call(iter(messages), metadata=metadata, timeout=30))
        except grpc.RpcError as error:
            return [error.code()]


def test_a_peer_stream_of_nonsense_is_refused_and_the_daemon_serves_on(hosts, daemon, tmp_path):
    import grpc

    from simnpu.proto import npu_pb2 as pb

    a = hosts[0]
    address = a.advertised
    join = pb.PeerMessage(join=pb.PeerJoin(rank=0, n_ranks=2)).SerializeToString()
    assert _peer_call(address, [join]) == [grpc.StatusCode.INVALID_ARGUMENT]
    assert _peer_call(address, [b"\xff\xff\xff"]) == [grpc.StatusCode.INVALID_ARGUMENT]
    assert _peer_call(address, []) == [grpc.StatusCode.INVALID_ARGUMENT]
    hello = pb.PeerMessage(hello=pb.PeerHello(comm_id=1, nonce=b"x" * 16, address="h:1"))
    assert _peer_call(address, [hello.SerializeToString()], token=None) == [
        grpc.StatusCode.UNAUTHENTICATED
    ]
    assert _peer_call(daemon.address, [hello.SerializeToString()]) == [
        grpc.StatusCode.FAILED_PRECONDITION  # it advertises no address
    ]
    replies = [
        pb.PeerMessage.FromString(raw) for raw in _peer_call(address, [hello.SerializeToString()])
    ]
    assert len(replies) == 1 and replies[0].failed.result == 1, replies  # another daemon's
    with open(root_info_file(a, tmp_path, "forgotten"), "rb") as handle:
        info = handle.read()
    nonce = ROOT_LAYOUT.unpack_from(info)[4]  # the daemon's nonce
    for comm_id in (0, 1 << 63):
        hello = pb.PeerMessage(hello=pb.PeerHello(comm_id=comm_id, nonce=nonce, address="h:1"))
        raw = _peer_call(address, [hello.SerializeToString(), join, b"\x00garbage"])
        replies = [pb.PeerMessage.FromString(r) for r in raw]
        assert [r.failed.result for r in replies] == [1], replies
        assert "unknown to the daemon" in replies[0].failed.message, replies
    assert_all_ok(run_world(hosts, [[0], [1]], EVERY_COLLECTIVE, tmp_path))


MISMATCHED = """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
count = 64 if os.environ["SIMNPU_ADDRESS"] == os.environ["FIRST"] else 128
x = npu.DeviceBuffer.from_array(np.ones(count, np.float32))
y = npu.DeviceBuffer(x.nbytes)
comm.all_reduce(x, y, "sum", dtype=np.float32, stream=stream)
try:
    stream.synchronize()
    report(code=0)
except NpuError as error:
    report(code=error.code, message=error.message)
comm.destroy()
"""


def test_calls_that_differ_between_hosts_fail_every_rank_naming_each_hosts_call(hosts, tmp_path):
    a, b = hosts
    results = run_world(hosts, [[0, 1], [2, 3]], MISMATCHED, tmp_path, env={"FIRST": a.address})
    assert_all_ok(results)
    for result in results:
        values = result.values
        assert values["code"] == 107000, values  # ACL_ERROR_RT_PARAM_INVALID: HCCL_E_PARA
        message = values["message"]
        assert f"host {a.advertised} (ranks 0, 1) called all_reduce(count=64" in message, values
        assert f"host {b.advertised} (ranks 2, 3) called all_reduce(count=128" in message, values


def write_table(path, hosts, layout, addresses=True) -> str:
    """A version 1.0 rank table of one server per daemon of `hosts`: server h holds the
    ranks layout[h] on its devices 0, 1, ...; `addresses`: each server's simnpu_address."""
    server_list = []
    for h, (daemon, ranks) in enumerate(zip(hosts, layout)):
        server = {
            "server_id": f"node_{h}",
            "device": [
                {"device_id": str(d), "device_ip": f"192.168.{h}.{d + 1}", "rank_id": str(r)}
                for d, r in enumerate(ranks)
            ],
        }
        if addresses:
            server["simnpu_address"] = daemon.advertised
        server_list.append(server)
    table = {
        "status": "completed",
        "version": "1.0",
        "server_count": str(len(server_list)),
        "server_list": server_list,
    }
    path.write_text(json.dumps(table))
    return str(path)


FROM_TABLE = EVERY_COLLECTIVE.replace(
    "comm = Communicator(N, exchange_root_info(), RANK)",
    'comm = Communicator.from_rank_table(os.environ["RANK_TABLE"], RANK)',
)


def test_a_rank_table_of_two_servers_forms_one_world_in_server_order(hosts, tmp_path):
    a, b = hosts
    # server order (b's first) decides the host order, not the lowest rank
    table = write_table(tmp_path / "table.json", [b, a], [[0, 3], [2, 1]])
    env = {"RANK_TABLE": table, "HCCL_TEST_HOSTS": json.dumps([[0, 3], [1, 2]])}
    results = run_world([b, a], [[0, 3], [2, 1]], FROM_TABLE, tmp_path, env=env)
    assert_all_ok(results)
    # the addresses from the ranks' environment instead of the table
    table = write_table(tmp_path / "bare.json", hosts, [[0, 1], [2, 3]], addresses=False)
    env = {
        "RANK_TABLE": table,
        "SIMNPU_SERVER_ADDRESSES": f"node_0={a.advertised},node_1={b.advertised}",
    }
    results = run_world(hosts, [[0, 1], [2, 3]], FROM_TABLE, tmp_path, env=env)
    assert_all_ok(results)


TABLE_REFUSED = """
try:
    Communicator.from_rank_table(os.environ["RANK_TABLE"], RANK)
    report(code=0)
except NpuError as error:
    report(code=error.code, message=error.message)
"""


def test_a_rank_table_whose_servers_and_daemons_disagree_is_refused(hosts, tmp_path):
    a, b = hosts
    swapped = write_table(tmp_path / "swapped.json", [b, a], [[0], [1]])  # rank 0 is on b
    results = run_world(hosts, [[0], [1]], TABLE_REFUSED, tmp_path, env={"RANK_TABLE": swapped})
    assert_all_ok(results)
    for result in results:
        values = result.values
        assert values["code"] == 1, values  # HCCL_E_PARA
        assert "whose daemon is at" in values["message"], values
    bare = write_table(tmp_path / "bare.json", hosts, [[0], [1]], addresses=False)
    env = {"RANK_TABLE": bare, "SIMNPU_SERVER_ADDRESSES": f"node_0={a.advertised}"}
    results = run_world(hosts, [[0], [1]], TABLE_REFUSED, tmp_path, env=env)
    assert_all_ok(results)
    for result in results:
        values = result.values
        assert values["code"] == 1 and "no daemon address for server node_1" in values["message"]


JOB = """
from simnpu.client.rendezvous import from_env

try:
    me = from_env()
except NpuError as error:
    report(code=error.code, message=error.message)
    raise SystemExit(0)
comm = Communicator(me.world_size, me.root_info, me.rank)
stream = npu.Stream()
x = npu.DeviceBuffer.from_array(np.full(1000, me.rank + 1, np.int64))
y = npu.DeviceBuffer(x.nbytes)
comm.all_reduce(x, y, "sum", dtype=np.int64, stream=stream)
stream.synchronize()
report(code=0, rank=me.rank, formation=me.formation, total=int(y.to_numpy(np.int64)[0]))
comm.destroy()
"""


def test_a_job_rendezvous_spans_hosts_through_its_seed_daemon(hosts, tmp_path):
    a, b = hosts
    env = {"SIMNPU_JOB": "spans", "SIMNPU_WORLD_SIZE": "4", "SIMNPU_JOB_SEED": a.advertised}
    results = run_world(hosts, [[0, 1], [2, 3]], JOB, tmp_path, env=env)
    assert_all_ok(results)
    values = [r.values for r in results]
    assert sorted(v["rank"] for v in values) == [0, 1, 2, 3], values
    assert all(v["total"] == 1 + 2 + 3 + 4 for v in values), values
    # a seed nobody listens at
    port = free_port()
    env = {"SIMNPU_JOB": "lost", "SIMNPU_WORLD_SIZE": "2", "SIMNPU_JOB_SEED": f"127.0.0.1:{port}"}
    results = run_world(hosts, [[], [0]], JOB, tmp_path, env=env)
    assert_all_ok(results)
    (values,) = [r.values for r in results]
    assert values["code"] == 11 and f"127.0.0.1:{port}" in values["message"], values


def test_a_process_that_dies_waiting_at_another_host_departs_from_the_seed(hosts, tmp_path):
    import subprocess
    import sys

    from simnpu.client.tools.query import query

    a, b = hosts
    env = {"SIMNPU_JOB": "depart", "SIMNPU_WORLD_SIZE": "2", "SIMNPU_JOB_SEED": a.advertised}
    code = "from simnpu.client.rendezvous import from_env\nfrom_env()\n"
    doomed = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, **env, "SIMNPU_ADDRESS": b.address, "SIMNPU_AUTOSTART": "0"},
    )

    def waiting() -> list:
        return query("jobs", address=a.address).get("depart", {}).get("waiting", [])

    deadline = time.monotonic() + 60
    while waiting() != [doomed.pid]:
        assert time.monotonic() < deadline, "the process never waited at the seed"
        time.sleep(0.02)
    doomed.kill()
    doomed.wait(30)
    while waiting():
        assert time.monotonic() < deadline, "the seed never saw it depart"
        time.sleep(0.02)
    results = run_world(hosts, [[0], [1]], JOB, tmp_path, env=env)
    assert_all_ok(results)
    values = [r.values for r in results]
    assert sorted(v["rank"] for v in values) == [0, 1] and {v["total"] for v in values} == {3}


CUT_OFF = """
marks = os.environ["MARK_DIR"]
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
x = npu.DeviceBuffer.from_array(np.full(1 << 16, RANK, np.float32))
y = npu.DeviceBuffer(x.nbytes)
count = 0
while True:
    comm.all_reduce(x, y, "sum", dtype=np.float32, stream=stream)
    try:
        stream.synchronize()
    except NpuError as error:
        report(code=error.code, message=error.message, after=count)
        break
    count += 1
    if count == 3:
        open(os.path.join(marks, f"reducing-{RANK}"), "w").close()
comm.destroy()
"""


@pytest.fixture
def two_namespaces():
    """Two network namespaces joined by a veth pair: (namespace, interface, address) each."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = secrets.token_hex(3)
    ends = [
        (f"simnpu-{tag}-{side}", f"sn{tag}{side}", f"10.213.{int(tag[:2], 16)}.{n}")
        for n, side in ((1, "a"), (2, "b"))
    ]

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    try:
        ip("link", "add", ends[0][1], "type", "veth", "peer", "name", ends[1][1])
        for namespace, interface, address in ends:
            ip("netns", "add", namespace)
            ip("link", "set", interface, "netns", namespace)
            ip("-n", namespace, "addr", "add", f"{address}/30", "dev", interface)
            ip("-n", namespace, "link", "set", interface, "up")
            ip("-n", namespace, "link", "set", "lo", "up")
        yield ends
    finally:
        for namespace, _, _ in ends:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)


def test_a_host_cut_off_fails_the_collectives_on_both_sides(two_namespaces, tmp_path):
    daemons = []
    try:
        for namespace, _, address in two_namespaces:
            directory = tmp_path / namespace
            directory.mkdir()
            daemons.append(
                DaemonProcess(
                    directory,
                    "--listen",
                    f"{address}:50151",
                    "--advertise",
                    f"{address}:50151",
                    env={"SIMNPU_TOKEN": TOKEN},  # Gloo binds to the advertised address
                    prefix=("ip", "netns", "exec", namespace),
                )
            )
        marks = tmp_path / "marks"
        marks.mkdir()
        outcome: list = []
        env = {"MARK_DIR": str(marks), "HCCL_EXEC_TIMEOUT": "6"}
        runner = threading.Thread(
            target=lambda: outcome.append(
                run_world(daemons, [[0], [1]], CUT_OFF, tmp_path, env=env, timeout=120)
            )
        )
        runner.start()
        deadline = time.monotonic() + 60
        while not all((marks / f"reducing-{r}").exists() for r in (0, 1)):
            if not runner.is_alive():
                runner.join()
                pytest.fail(f"the world never reduced: {outcome}")
            assert time.monotonic() < deadline, "the world never reduced"
            time.sleep(0.02)
        namespace, interface, _ = two_namespaces[0]
        import subprocess

        subprocess.run(
            ["ip", "-n", namespace, "link", "set", interface, "down"], check=True, timeout=30
        )
        runner.join(150)
        (results,) = outcome
        assert_all_ok(results)
        coordinator, member = (r.values for r in results)
        for values in (coordinator, member):
            assert values["code"] == 507904, values  # HCCL_E_REMOTE at synchronize
        # within seconds, long before the exchange's HCCL_EXEC_TIMEOUT: the member's
        # keepalive finds the coordinator gone, the coordinator misses the heartbeats
        assert "lost the coordinator" in member["message"], member
        assert two_namespaces[0][2] in member["message"], member
        lost = f"lost host {two_namespaces[1][2]}:50151 (rank 1): no word from the peer daemon"
        assert lost in coordinator["message"], coordinator
    finally:
        for daemon in daemons:
            assert daemon.stop() == 0, daemon.output()
