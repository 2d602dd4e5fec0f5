"""HCCL collectives between rank processes of one daemon: every collective and data type
class with 2, 4 and 8 ranks, checked bit for bit against numpy reductions in rank order;
in place; ordering with compute on the same stream; ranks on one device or several.

Each rank is a separate Python process (tests/integration/hccl_ranks.py) that computes
every rank's inputs from seeds, so it can check its own results without talking to the
others except through the collectives under test.
"""

from __future__ import annotations

import pytest
from conftest import children_of
from hccl_ranks import assert_all_ok, run_ranks

from simnpu.server.core.unit_protocol import REDUCE_BLOCK_BYTES

pytestmark = pytest.mark.multiprocess


DATA = '''
import ml_dtypes

TYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
         "uint8", "uint16", "uint32", "uint64"]
UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def dtype_of(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def data(case, rank, count, dtype, small=False):
    """Rank `rank`'s input of test case `case`: the same in every process."""
    rng = np.random.default_rng(case * 1000 + rank)
    if dtype.kind == "f" or dtype == dtype_of("bfloat16"):
        values = rng.standard_normal(count) * (1.5 if small else 50)
    elif dtype.kind == "u":
        values = rng.integers(0, 4 if small else 200, count)
    else:
        values = rng.integers(-3 if small else -100, 4 if small else 100, count)
    return values.astype(dtype)


def reduced(op, arrays):
    """The reduction in rank order, as HCCL on the simulated NPU does it."""
    with np.errstate(all="ignore"):
        result = arrays[0].copy()
        for array in arrays[1:]:
            result = UFUNCS[op](result, array).astype(arrays[0].dtype)
    return result
'''

EVERY_COLLECTIVE = (
    DATA
    + """
comm = Communicator(N, exchange_root_info(), RANK)
assert (comm.rank, comm.size) == (RANK, N)
stream = npu.Stream()
checks = []  # (buffer, expected array) compared after one synchronize
keep = []

def device(array):
    buffer = npu.DeviceBuffer.from_array(array)
    keep.append(buffer)
    return buffer

def empty(count, dtype):
    buffer = npu.DeviceBuffer(max(1, count * dtype.itemsize))
    keep.append(buffer)
    return buffer

case = 0
for name in TYPES:
    dt = dtype_of(name)
    count = 257 + case % 7
    for op in UFUNCS:
        case += 1
        send = device(data(case, RANK, count, dt, small=(op == "prod")))
        recv = empty(count, dt)
        comm.all_reduce(send, recv, op, dtype=dt, stream=stream)
        inputs = [data(case, r, count, dt, op == "prod") for r in range(N)]
        checks.append((recv, reduced(op, inputs)))
    case += 1
    root = case % N
    buffer = device(data(case, RANK, count, dt))
    comm.broadcast(buffer, root, dtype=dt, stream=stream)
    checks.append((buffer, data(case, root, count, dt)))
    case += 1
    recv = empty(count * N, dt)
    comm.all_gather(device(data(case, RANK, count, dt)), recv, dtype=dt, stream=stream)
    checks.append((recv, np.concatenate([data(case, r, count, dt) for r in range(N)])))
    case += 1
    recv = empty(count, dt)
    send = device(data(case, RANK, count * N, dt))
    comm.reduce_scatter(send, recv, "sum", dtype=dt, stream=stream)
    total = reduced("sum", [data(case, r, count * N, dt) for r in range(N)])
    checks.append((recv, total[RANK * count:(RANK + 1) * count]))
    case += 1
    root = (case + 1) % N
    recv = empty(count, dt)
    comm.reduce(device(data(case, RANK, count, dt)), recv, "max", root, dtype=dt, stream=stream)
    if RANK == root:
        checks.append((recv, reduced("max", [data(case, r, count, dt) for r in range(N)])))
    case += 1
    recv = empty(count * N, dt)
    comm.alltoall(device(data(case, RANK, count * N, dt)), recv, dtype=dt, stream=stream)
    mine = slice(RANK * count, (RANK + 1) * count)
    checks.append((recv, np.concatenate([data(case, r, count * N, dt)[mine]
                                         for r in range(N)])))
    case += 1
    root = case % N
    recv = empty(count, dt)
    comm.scatter(device(data(case, RANK, count * N, dt)), recv, root, dtype=dt, stream=stream)
    checks.append((recv, data(case, root, count * N, dt)[RANK * count:(RANK + 1) * count]))
    case += 1  # a ring of send/recv: even ranks send first, odd ranks receive first
    recv = empty(count, dt)
    to, source = (RANK + 1) % N, (RANK - 1) % N
    mine = device(data(case, RANK, count, dt))
    if RANK % 2 == 0:
        comm.send(mine, to, dtype=dt, stream=stream)
        comm.recv(recv, source, dtype=dt, stream=stream)
    else:
        comm.recv(recv, source, dtype=dt, stream=stream)
        comm.send(mine, to, dtype=dt, stream=stream)
    checks.append((recv, data(case, source, count, dt)))
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


def test_every_collective_and_type_4_ranks_on_4_devices(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 4, EVERY_COLLECTIVE, tmp_path, devices=[0, 1, 2, 3])
    assert_all_ok(results)
    assert sum(r.values["checked"] for r in results) == 4 * 12 * 10 + 12  # reduce: at its root


def test_every_collective_and_type_2_ranks_on_one_device(daemon4, tmp_path):
    """Several ranks on one device: the simnpu extension."""
    results = run_ranks(daemon4.address, 2, EVERY_COLLECTIVE, tmp_path, devices=[1, 1])
    assert_all_ok(results)
    assert sum(r.values["checked"] for r in results) == 2 * 12 * 10 + 12


EIGHT = (
    DATA
    + """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
count = 10001
x = data(1, RANK, count, np.dtype("float32"))
total = comm.all_reduce_array(x)
expected = reduced("sum", [data(1, r, count, np.dtype("float32")) for r in range(N)])
assert total.tobytes() == expected.tobytes()
gathered = comm.all_gather_array(np.arange(5, dtype=np.int64) + 10 * RANK)
assert gathered.tolist() == [[10 * r + i for i in range(5)] for r in range(N)]
assert comm.broadcast_array(np.full(3, RANK, np.uint16), root=5).tolist() == [5, 5, 5]
report(ok=True)
comm.destroy()
"""
)


@pytest.mark.slow
def test_8_ranks_two_per_device(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 8, EIGHT, tmp_path, devices=[r % 4 for r in range(8)])
    assert_all_ok(results)


IN_PLACE = (
    DATA
    + """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
f32 = np.dtype("float32")
count = 3_000_001  # 12 MB: several pieces over the AI cores, many cache blocks each
x = data(7, RANK, count, f32)
buffer = npu.DeviceBuffer.from_array(x)
comm.all_reduce(buffer, op="sum", dtype=f32, stream=stream)       # send == recv
stream.synchronize()
expected = reduced("sum", [data(7, r, count, f32) for r in range(N)])
first = buffer.to_numpy(f32)
assert first.tobytes() == expected.tobytes()
buffer.copy_from_host(x)
comm.all_reduce(buffer, op="sum", dtype=f32, stream=stream)       # the same bits again
stream.synchronize()
assert buffer.to_numpy(f32).tobytes() == first.tobytes()

block = 1000
gather = npu.DeviceBuffer(block * N * 4)  # all_gather, NCCL in-place layout
gather.copy_from_host(np.full(block, RANK + 1, np.int32), offset=RANK * block * 4)
comm.all_gather(gather.ptr + RANK * block * 4, gather, dtype=np.int32, count=block, stream=stream)
stream.synchronize()
assert gather.to_numpy(np.int32).tolist() == [r + 1 for r in range(N) for _ in range(block)]

mine = data(8, RANK, block * N, np.dtype("int64"))                 # reduce_scatter, in-place layout
scattered = npu.DeviceBuffer.from_array(mine)
mine_out = scattered.ptr + RANK * block * 8
comm.reduce_scatter(scattered, mine_out, dtype=np.int64, count=block, stream=stream)
stream.synchronize()
total = reduced("sum", [data(8, r, block * N, np.dtype("int64")) for r in range(N)])
got = scattered.to_numpy(np.int64)[RANK * block:(RANK + 1) * block]
assert np.array_equal(got, total[RANK * block:(RANK + 1) * block])

both = npu.DeviceBuffer.from_array(data(9, RANK, block * N, np.dtype("int16")))  # send == recv
comm.alltoall(both, both, dtype=np.int16, stream=stream)
stream.synchronize()
expected = np.concatenate([data(9, r, block * N, np.dtype("int16"))[RANK * block:(RANK + 1) * block]
                           for r in range(N)])
assert np.array_equal(both.to_numpy(np.int16), expected)
report(ok=True)
comm.destroy()
"""
)


def test_in_place_big_and_reproducible_2_ranks(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 2, IN_PLACE, tmp_path, devices=[2, 3])
    assert_all_ok(results)


BIG = (
    DATA
    + """
from simnpu.server.core.unit_protocol import REDUCE_BLOCK_BYTES

comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()

def device(array):
    return npu.DeviceBuffer.from_array(array)

def check(buffer, expected):
    got = buffer.to_numpy(expected.dtype)[:expected.size]
    assert got.tobytes() == expected.tobytes(), (expected.dtype, got[:8], expected[:8])

# pieces of more than a cache block (copied with non-temporal stores), counts no multiple
# of a block, of a vector or of the pieces
for case, (name, op) in enumerate((("int8", "sum"), ("bfloat16", "max")), start=20):
    dt = dtype_of(name)
    count = 4 * REDUCE_BLOCK_BYTES // dt.itemsize + 2 * case + 1
    inputs = [data(case, r, count, dt) for r in range(N)]
    send, recv = device(inputs[RANK]), npu.DeviceBuffer(count * dt.itemsize)
    comm.all_reduce(send, recv, op, dtype=dt, stream=stream)       # out of place
    stream.synchronize()
    check(recv, reduced(op, inputs))
    for buffer in (send, recv):
        buffer.free()
    part = count // 2
    send, recv = device(inputs[RANK][:part]), npu.DeviceBuffer(part * N * dt.itemsize)
    comm.all_gather(send, recv, dtype=dt, stream=stream)           # out of place
    gathered = device(np.zeros(part * N, dt))                      # in place
    gathered.copy_from_host(inputs[RANK][:part], offset=RANK * part * dt.itemsize)
    comm.all_gather(gathered.ptr + RANK * part * dt.itemsize, gathered, dtype=dt, count=part,
                    stream=stream)
    stream.synchronize()
    for buffer in (recv, gathered):
        check(buffer, np.concatenate([a[:part] for a in inputs]))
    for buffer in (send, recv, gathered):
        buffer.free()
    whole = [np.concatenate([a, a])[:part * N] for a in inputs]
    send, recv = device(whole[RANK]), npu.DeviceBuffer(part * dt.itemsize)
    comm.reduce_scatter(send, recv, op, dtype=dt, stream=stream)
    stream.synchronize()
    check(recv, reduced(op, whole)[RANK * part:(RANK + 1) * part])
    for buffer in (send, recv):
        buffer.free()
report(ok=True)
comm.destroy()
"""
)


def test_big_collectives_of_odd_sizes_every_width(daemon4, tmp_path):
    """Blocks that the AI cores copy with non-temporal stores, and the odd ends after them."""
    results = run_ranks(daemon4.address, 2, BIG, tmp_path, devices=[2, 3])
    assert_all_ok(results)


def test_workers_copy_large_blocks_with_non_temporal_stores(daemon4):
    environments = []
    for pid in children_of(daemon4.pid):
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environments.append(handle.read())
    assert environments
    threshold = f"glibc.cpu.x86_non_temporal_threshold={REDUCE_BLOCK_BYTES:#x}".encode()
    for environment in environments:
        tunables = [v for v in environment.split(b"\0") if v.startswith(b"GLIBC_TUNABLES=")]
        assert tunables and threshold in tunables[0]


ORDERING = '''
KERNELS = """
import time
from simnpu import kernel

@kernel("ptr", "u32", "f32", "f64")
def slow_fill(ctx, x, n, value, delay):
    time.sleep(delay)
    ctx.gm(x, "float32", n)[:] = value

@kernel("ptr", "ptr", "u32")
def square(ctx, x, y, n):
    a = ctx.gm(x, "float32", n, access="r")
    ctx.gm(y, "float32", n)[:] = a * a
"""
module = npu.Module.from_source(KERNELS, "ordering.py")
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
n = 100_000
grads = npu.DeviceBuffer(n * 4)
grads.fill(0)
out = npu.DeviceBuffer(n * 4)
module.function("slow_fill").launch(1, grads, n, float(RANK + 1), 0.3, stream=stream)  # compute
if RANK == 1:
    time.sleep(0.3)  # this rank's host reaches the collective late: the others' streams wait
comm.all_reduce(grads, op="sum", dtype=np.float32, stream=stream)                    # all_reduce
module.function("square").launch(2, grads, out, n, stream=stream)                      # compute
stream.synchronize()
total = sum(range(1, N + 1))
assert np.array_equal(out.to_numpy(np.float32), np.full(n, total * total, np.float32))
report(ok=True)
comm.destroy()
'''


def test_compute_all_reduce_compute_on_one_stream(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 4, ORDERING, tmp_path, devices=[0, 1, 2, 3])
    assert_all_ok(results)


def test_the_data_parallel_example_matches_numpy(daemon4):
    import os
    import subprocess
    import sys

    example = os.path.join(
        os.path.dirname(__file__), "..", "..", "examples", "hccl_data_parallel.py"
    )
    result = subprocess.run(
        [sys.executable, example],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SIMNPU_ADDRESS": daemon4.address, "SIMNPU_AUTOSTART": "0"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every rank's weights identical bit for bit: True" in result.stdout
    assert result.stdout.strip().endswith("ok")


VMM = """
import acl
prop = {"handle_type": 0, "allocation_type": 0, "mem_attr": 4,
        "location": {"id": DEVICE, "type": 1}, "reserve": 0}
chunk = 2 << 20
base, ret = acl.rt.reserve_mem_address(64 << 20, 0, 0, 0)
assert ret == 0, ret
handles = []
for index in range(2):  # two physical chunks mapped side by side: one buffer
    handle, ret = acl.rt.malloc_physical(chunk, prop, 0)
    assert ret == 0, ret
    assert acl.rt.map_mem(base + index * chunk, chunk, 0, handle, 0) == 0
    handles.append(handle)
n = 2 * chunk // 4
mine = np.arange(n, dtype=np.float32) * (RANK + 1)
assert acl.rt.memcpy(base, 2 * chunk, mine.ctypes.data, 2 * chunk, 1) == 0
comm, ret = hccl.comm_init_root_info(N, exchange_root_info(), RANK)
assert ret == 0, ret
stream, _ = acl.rt.create_stream()
assert hccl.all_reduce(base, base, n, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm,
                       stream) == 0
assert acl.rt.synchronize_stream(stream) == 0
out = np.zeros(n, np.float32)
assert acl.rt.memcpy(out.ctypes.data, 2 * chunk, base, 2 * chunk, 2) == 0
assert np.array_equal(out, np.arange(n, dtype=np.float32) * sum(range(1, N + 1)))
assert hccl.comm_destroy(comm) == 0
for index, handle in enumerate(handles):
    assert acl.rt.unmap_mem(base + index * chunk) == 0
    assert acl.rt.free_physical(handle) == 0
assert acl.rt.release_mem_address(base) == 0
report(ok=True)
"""


def test_all_reduce_in_place_on_mapped_memory(daemon4, tmp_path):
    """Collectives work on memory mapped at reserved addresses (aclrtMapMem), across two
    physical chunks mapped side by side, as on aclrtMalloc memory."""
    results = run_ranks(daemon4.address, 2, VMM, tmp_path, devices=[0, 1])
    assert_all_ok(results)
