"""One HCCL world over two daemons (docs/multihost.md): two real daemons on this machine,
each with its own devices, shared memory and engine processes, joined over loopback TCP;
rank processes of each daemon's own."""

from __future__ import annotations

import json
import secrets
import socket

import pytest
from conftest import DaemonProcess
from hccl_ranks import assert_all_ok, run_ranks

pytest.importorskip("torch", reason="the multihost extra (torch) is not installed")

TOKEN = secrets.token_hex(16)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_host(directory) -> DaemonProcess:
    port = free_port()
    return DaemonProcess(
        directory,
        "--listen",
        f"127.0.0.1:{port}",
        "--advertise",
        f"127.0.0.1:{port}",
        "--devices",
        "2",
        "--memory",
        "128MiB",
        env={"SIMNPU_TOKEN": TOKEN, "GLOO_SOCKET_IFNAME": "lo"},
    )


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
    host_order = sorted((sorted(ranks) for ranks in layout), key=lambda ranks: ranks[0])
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
