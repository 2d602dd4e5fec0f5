"""HCCL collectives inside captured graphs (aclmdlRI): each rank captures its own graph with
collectives in it; every replay runs them, each taking the communicator's next place in
the call order when the replay is submitted, so eager and replayed collectives interleave
the same way on every rank. Mismatches, a rank killed during a replay, aclmdlRIAbort of a
replay waiting in a collective and a communicator destroyed before a replay fail as eager
collectives do (docs/graph-capture.md, docs/hccl.md).

Ranks are separate processes (tests/integration/hccl_ranks.py), pyACL programs: `acl` for
the capture and replay calls, `hccl` for the collectives. Integer data, so every result is
checked bit for bit against numpy.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hccl_ranks import PRELUDE, assert_all_ok, run_ranks

from simnpu.proto import codes
from simnpu.proto import hccl_types as ht

pytestmark = pytest.mark.multiprocess


DEVICES = [0, 1, 2, 3]


def smi(address: str) -> subprocess.CompletedProcess:
    """`simnpu smi --json` of the daemon."""
    return subprocess.run(
        [sys.executable, "-m", "simnpu", "smi", "--address", address, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


COMMON = """
import acl

INT32 = hccl.HCCL_DATA_TYPE_INT32
SUM = hccl.HCCL_REDUCE_SUM
D2D = acl.ACL_MEMCPY_DEVICE_TO_DEVICE
GLOBAL = acl.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL


def check(ret, what):
    if ret != 0:
        raise SystemExit(f"rank {RANK}: {what} returned {ret}: {acl.get_recent_err_msg()}")


def sync_code(stream):
    ret = acl.rt.synchronize_stream(stream)
    return ret, (acl.get_recent_err_msg() or "") if ret else ""


def inputs(step, rank, count):
    return np.random.default_rng(step * 100 + rank).integers(-1000, 1000, count).astype(np.int32)


def buffer(count):
    return npu.DeviceBuffer(count * 4)


comm = Communicator(N, exchange_root_info(), RANK)
stream, ret = acl.rt.create_stream()
check(ret, "create_stream")
"""

REPLAYS = (
    COMMON
    + """
COUNT = 64  # a multiple of N: reduce_scatter gives each rank COUNT // N
x, y, total, gathered, scattered = (buffer(c) for c in (COUNT, COUNT, COUNT, COUNT * N, COUNT // N))
for b in (y, total, gathered, scattered):
    b.fill(0)

check(acl.mdl.ri_capture_begin(stream, GLOBAL), "ri_capture_begin")
check(acl.rt.memcpy_async(y.ptr, COUNT * 4, x.ptr, COUNT * 4, D2D, stream), "memcpy_async")
check(hccl.all_reduce(y.ptr, total.ptr, COUNT, INT32, SUM, comm.handle, stream), "all_reduce")
check(hccl.all_gather(total.ptr, gathered.ptr, COUNT, INT32, comm.handle, stream), "all_gather")
check(hccl.reduce_scatter(x.ptr, scattered.ptr, COUNT // N, INT32, SUM, comm.handle, stream),
      "reduce_scatter")
model, ret = acl.mdl.ri_capture_end(stream)
check(ret, "ri_capture_end")
status, _, ret = acl.mdl.ri_capture_get_info(stream)
recorded_only = not total.to_numpy(np.int32).any()  # nothing ran at capture
streams, ret = acl.mdl.ri_get_streams(model)
tasks, ret = acl.mdl.ri_get_tasks_by_stream(streams[0])
types = [acl.mdl.ri_task_get_type(task)[0] for task in tasks]

results = []
for step in range(3):
    x.copy_from_host(inputs(step, RANK, COUNT))  # new input between replays
    if step < 2:
        check(acl.mdl.ri_execute_async(model, stream), "ri_execute_async")
        check(acl.rt.synchronize_stream(stream), "synchronize_stream")
    else:  # the blocking replay
        check(acl.mdl.ri_execute(model, -1), "ri_execute")
    every = [inputs(step, r, COUNT) for r in range(N)]
    expected = every[0].copy()
    for array in every[1:]:
        expected += array
    results.append(
        [
            np.array_equal(total.to_numpy(np.int32), expected),
            np.array_equal(gathered.to_numpy(np.int32), np.tile(expected, N)),
            np.array_equal(
                scattered.to_numpy(np.int32),
                expected.reshape(N, COUNT // N)[RANK],
            ),
        ]
    )
check(acl.mdl.ri_destroy(model), "ri_destroy")
report(recorded_only=recorded_only, types=types, default=acl.ACL_MODEL_RI_TASK_DEFAULT,
       results=results,
       checksum=int(total.to_numpy(np.int32).astype(np.int64).sum()))
comm.destroy()
"""
)


def test_each_replay_runs_the_captured_collectives_on_new_input(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 4, REPLAYS, tmp_path, devices=DEVICES)
    assert_all_ok(results)
    values = [r.values for r in results]
    for v in values:
        assert v["recorded_only"]
        # the copy and three collectives, on the origin stream (aclmdlRITaskType has no
        # kind for collectives)
        assert v["types"] == [v["default"]] * 4
        assert v["results"] == [[True, True, True]] * 3
    assert len({v["checksum"] for v in values}) == 1  # every rank got the same sum


INTERLEAVED = (
    COMMON
    + """
# eager and replayed collectives of different sizes: any rank taking another order than
# the others would meet a mismatch
eager_stream, ret = acl.rt.create_stream()
a, b, c, d, e = buffer(8), buffer(16), buffer(16), buffer(4), buffer(4 * N)


def capture():
    check(acl.mdl.ri_capture_begin(stream, GLOBAL), "ri_capture_begin")
    check(hccl.all_reduce(b.ptr, c.ptr, 16, INT32, SUM, comm.handle, stream), "all_reduce")
    check(hccl.all_gather(d.ptr, e.ptr, 4, INT32, comm.handle, stream), "all_gather")
    model, ret = acl.mdl.ri_capture_end(stream)
    check(ret, "ri_capture_end")
    return model


a.copy_from_host(np.full(8, RANK + 1, np.int32))
b.copy_from_host(np.arange(16, dtype=np.int32) * (RANK + 1))
d.copy_from_host(np.full(4, RANK * 10, np.int32))
if RANK % 2 == 0:  # a capture takes no place in the order: capture before or after
    model = capture()
check(hccl.all_reduce(a.ptr, a.ptr, 8, INT32, SUM, comm.handle, eager_stream), "eager all_reduce")
if RANK % 2 == 1:
    model = capture()
check(acl.mdl.ri_execute_async(model, stream), "first replay")
check(hccl.broadcast(a.ptr, 8, INT32, 1, comm.handle, eager_stream), "eager broadcast")
check(acl.mdl.ri_execute_async(model, stream), "second replay")
check(acl.rt.synchronize_stream(eager_stream), "synchronize eager")
check(acl.rt.synchronize_stream(stream), "synchronize replays")
weights = sum(r + 1 for r in range(N))
report(
    a=a.to_numpy(np.int32).tolist(),
    c=c.to_numpy(np.int32).tolist(),
    e=e.to_numpy(np.int32).tolist(),
    expected_c=(np.arange(16) * weights).tolist(),
    expected_a=[weights] * 8,
)
check(acl.mdl.ri_destroy(model), "ri_destroy")
comm.destroy()
"""
)


def test_eager_and_replayed_collectives_interleave_in_call_order(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 4, INTERLEAVED, tmp_path, devices=DEVICES)
    assert_all_ok(results)
    for v in (r.values for r in results):
        assert v["a"] == v["expected_a"]  # the eager all_reduce, then rank 1's broadcast
        assert v["c"] == v["expected_c"]
        assert v["e"] == [0] * 4 + [10] * 4 + [20] * 4 + [30] * 4


PAIRS = (
    COMMON
    + """
# send/recv between rank pairs (0-1, 2-3) and an alltoall, captured; eager send/recv of
# another count between the replays: each pair's j-th send meets the peer's j-th recv
peer = RANK ^ 1
out, into, eager_out, eager_into = buffer(8), buffer(8), buffer(4), buffer(4)
spread, gathered = buffer(4 * N), buffer(4 * N)
eager_out.copy_from_host(np.full(4, RANK + 1, np.int32))


def pair(send_buffer, recv_buffer, count, on):
    if RANK % 2 == 0:  # (on one stream a send waits for its recv: even ranks send first)
        check(hccl.send(send_buffer.ptr, count, INT32, peer, comm.handle, on), "send")
        check(hccl.recv(recv_buffer.ptr, count, INT32, peer, comm.handle, on), "recv")
    else:
        check(hccl.recv(recv_buffer.ptr, count, INT32, peer, comm.handle, on), "recv")
        check(hccl.send(send_buffer.ptr, count, INT32, peer, comm.handle, on), "send")


check(acl.mdl.ri_capture_begin(stream, GLOBAL), "ri_capture_begin")
pair(out, into, 8, stream)
check(hccl.alltoall(spread.ptr, 4, INT32, gathered.ptr, 4, INT32, comm.handle, stream), "alltoall")
model, ret = acl.mdl.ri_capture_end(stream)
check(ret, "ri_capture_end")
eager_stream, ret = acl.rt.create_stream()
received, exchanged, eager = [], [], []
for step in range(2):
    eager_into.fill(0)
    pair(eager_out, eager_into, 4, eager_stream)
    check(acl.rt.synchronize_stream(eager_stream), "synchronize eager")
    eager.append(eager_into.to_numpy(np.int32).tolist())
    out.copy_from_host(np.full(8, RANK * 100 + step, np.int32))
    spread.copy_from_host(RANK * 1000 + step * 7 + np.arange(4 * N, dtype=np.int32))
    check(acl.mdl.ri_execute_async(model, stream), "ri_execute_async")
    check(acl.rt.synchronize_stream(stream), "synchronize replay")
    received.append(into.to_numpy(np.int32).tolist())
    exchanged.append(gathered.to_numpy(np.int32).tolist())
check(acl.mdl.ri_destroy(model), "ri_destroy")
report(received=received, exchanged=exchanged, eager=eager)
comm.destroy()
"""
)


def test_send_recv_and_alltoall_in_replays(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 4, PAIRS, tmp_path, devices=DEVICES)
    assert_all_ok(results)
    for rank, v in enumerate(r.values for r in results):
        peer = rank ^ 1
        assert v["eager"] == [[peer + 1] * 4] * 2
        assert v["received"] == [[peer * 100 + step] * 8 for step in range(2)]
        for step, got in enumerate(v["exchanged"]):
            assert got == [i * 1000 + step * 7 + rank * 4 + j for i in range(4) for j in range(4)]


MISMATCH = (
    COMMON
    + """
data = buffer(64)
check(acl.mdl.ri_capture_begin(stream, GLOBAL), "ri_capture_begin")
count = 32 if RANK == 3 else 16  # rank 3 captured another count
check(hccl.all_reduce(data.ptr, data.ptr, count, INT32, SUM, comm.handle, stream), "all_reduce")
model, ret = acl.mdl.ri_capture_end(stream)
check(ret, "ri_capture_end")
check(acl.mdl.ri_execute_async(model, stream), "ri_execute_async")
code, message = sync_code(stream)
error, ret = hccl.get_comm_async_error(comm.handle)
after = comm.all_reduce_array(np.full(4, RANK + 1, np.int32)).tolist()  # the next one works
report(code=code, message=message, async_error=error, after=after)
check(acl.mdl.ri_destroy(model), "ri_destroy")
comm.destroy()
"""
)


def test_a_mismatch_inside_replays_is_reported_as_for_eager_collectives(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 4, MISMATCH, tmp_path, devices=DEVICES)
    program = (PRELUDE + textwrap.dedent(MISMATCH)).splitlines()
    site = 1 + next(i for i, line in enumerate(program) if line.startswith("check(hccl.all_reduce"))
    assert_all_ok(results)
    values = [r.values for r in results]
    assert [v["code"] for v in values] == [codes.ACL_ERROR_RT_PARAM_INVALID] * 4
    assert [v["async_error"] for v in values] == [ht.HCCL_E_PARA] * 4
    for v in values:
        message = v["message"]
        assert "collective #0" in message
        assert "called all_reduce(count=32, int32, sum)" in message  # rank 3's call
        assert "all_reduce(count=16, int32, sum)" in message
        assert f"submitted at <string>:{site}" in message  # the capture's line
    assert [v["after"] for v in values] == [[10] * 4] * 4


KILLED = (
    COMMON
    + """
data = buffer(64)
data.copy_from_host(np.arange(64, dtype=np.int32))
event, ret = acl.rt.create_event_with_flag(acl.ACL_EVENT_EXTERNAL)
check(ret, "create_event_with_flag")
check(acl.mdl.ri_capture_begin(stream, GLOBAL), "ri_capture_begin")
if RANK == 3:  # its replay waits for an event nobody records: it never reaches the collective
    check(acl.rt.stream_wait_event(stream, event), "stream_wait_event")
check(hccl.all_reduce(data.ptr, data.ptr, 64, INT32, SUM, comm.handle, stream), "all_reduce")
model, ret = acl.mdl.ri_capture_end(stream)
check(ret, "ri_capture_end")
check(acl.mdl.ri_execute_async(model, stream), "ri_execute_async")
if RANK == 3:
    _, _, ret = acl.rt.get_mem_info(acl.ACL_HBM_MEM)  # (a round trip: the replay was submitted)
    for r in range(3):
        wait_for(f"replaying{r}")
    os.kill(os.getpid(), signal.SIGKILL)
touch(f"replaying{RANK}")
code, message = sync_code(stream)
error, ret = hccl.get_comm_async_error(comm.handle)
healthy = data.to_numpy(np.int32).tolist() == list(range(64))  # untouched; copies still work
check(acl.mdl.ri_destroy(model), "ri_destroy")
report(code=code, message=message, async_error=error, healthy=healthy)
comm.destroy()
"""
)


def test_a_rank_killed_during_its_replay_fails_the_others(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 4, KILLED, tmp_path, devices=DEVICES, timeout=60)
    assert results[3].returncode == -signal.SIGKILL, results[3].describe()
    assert_all_ok(results[:3])
    for v in (r.values for r in results[:3]):
        assert v["code"] == codes.ACL_ERROR_RT_COMM_OP_RETRY_FAIL
        assert v["async_error"] == ht.HCCL_E_REMOTE
        assert "rank 3 (pid" in v["message"]
        assert "ended (its process exited or was killed)" in v["message"]
        assert v["healthy"]
    # every rank's session is gone, the killed one's with its graph and replay (the daemon's
    # stop at the module's end checks that no worker, segment or traceback is left)
    deadline = time.monotonic() + 30
    while True:
        view = json.loads(smi(daemon4.address).stdout)
        if not view["processes"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert view["processes"] == [], view


ABORTED = (
    COMMON
    + """
data = buffer(16)
data.copy_from_host(np.full(16, RANK + 1, np.int32))
check(acl.mdl.ri_capture_begin(stream, GLOBAL), "ri_capture_begin")
check(hccl.all_reduce(data.ptr, data.ptr, 16, INT32, SUM, comm.handle, stream), "all_reduce")
model, ret = acl.mdl.ri_capture_end(stream)
check(ret, "ri_capture_end")
if RANK == 0:  # replays alone: its collective waits for the others, then is aborted
    check(acl.mdl.ri_execute_async(model, stream), "ri_execute_async")
    _, _, ret = acl.rt.get_mem_info(acl.ACL_HBM_MEM)  # (a round trip: the replay was submitted)
    abort = acl.mdl.ri_abort(model)
    touch("aborted")
else:
    wait_for("aborted")
    abort = 0
    check(acl.mdl.ri_execute_async(model, stream), "ri_execute_async")
code, message = sync_code(stream)
again = sync_code(stream)[0]
after = comm.all_reduce_array(np.full(4, RANK + 1, np.int32)).tolist()  # the next one works
unchanged = data.to_numpy(np.int32).tolist() == [RANK + 1] * 16
check(acl.mdl.ri_destroy(model), "ri_destroy")
report(abort=abort, code=code, message=message, again=again, after=after, unchanged=unchanged)
comm.destroy()
"""
)


def test_ri_abort_ends_a_replay_waiting_in_a_collective(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 4, ABORTED, tmp_path, devices=DEVICES)
    assert_all_ok(results)
    values = [r.values for r in results]
    assert values[0]["abort"] == 0
    assert values[0]["code"] == codes.ACL_ERROR_RT_MODEL_ABORT_NORMAL
    for v in values[1:]:  # the peers' collective fails as if rank 0 had dropped it
        assert v["code"] == codes.ACL_ERROR_RT_COMM_OP_RETRY_FAIL
        assert "rank 0 (pid" in v["message"]
        assert "aborted (aclmdlRIAbort) its all_reduce(count=16, int32, sum)" in v["message"]
    for v in values:
        assert v["again"] == 0  # reported once
        assert v["unchanged"]
        assert v["after"] == [10] * 4


DESTROYED = (
    COMMON
    + """
data = buffer(16)
check(acl.mdl.ri_capture_begin(stream, GLOBAL), "ri_capture_begin")
check(hccl.all_reduce(data.ptr, data.ptr, 16, INT32, SUM, comm.handle, stream), "all_reduce")
model, ret = acl.mdl.ri_capture_end(stream)
check(ret, "ri_capture_end")
if RANK == 1:
    comm.destroy()
    touch("destroyed")
else:
    wait_for("destroyed")
check(acl.mdl.ri_execute_async(model, stream), "ri_execute_async")
code, message = sync_code(stream)
check(acl.mdl.ri_destroy(model), "ri_destroy")
report(code=code, message=message)
if RANK != 1:
    comm.destroy()
"""
)


def test_a_communicator_destroyed_after_the_capture(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 2, DESTROYED, tmp_path, devices=[0, 1])
    assert_all_ok(results)
    mine, peer = results[1].values, results[0].values
    assert mine["code"] == codes.ACL_ERROR_RT_PARAM_INVALID  # as an eager call: a bad argument
    assert "destroyed communicator" in mine["message"]
    assert "(HcclCommDestroy) before this replay" in mine["message"]
    assert peer["code"] == codes.ACL_ERROR_RT_COMM_OP_RETRY_FAIL
    assert "rank 1 (pid" in peer["message"]
    assert "destroyed the communicator before submitting it" in peer["message"]


PYTHONIC = """
stream = npu.Stream()
x = npu.DeviceBuffer.from_array(np.zeros(32, np.int64))
out = npu.DeviceBuffer(32 * 8 * N)
with Communicator(N, exchange_root_info(), RANK) as comm:
    g = npu.Graph()
    with npu.graph(g, stream=stream):
        comm.all_reduce(x, dtype=np.int64)
        comm.all_gather(x, out, dtype=np.int64)
    table = repr(g)
    sums = []
    for step in range(3):
        x.copy_from_host(np.arange(32, dtype=np.int64) * (RANK + step))
        g.replay(stream)
        stream.synchronize()
        sums.append(out.to_numpy(np.int64).tolist())
    g.destroy()
report(sums=sums, table=table)
"""


def test_pythonic_graph_around_collectives(daemon4, tmp_path):
    results = run_ranks(daemon4.address, 4, PYTHONIC, tmp_path, devices=DEVICES)
    assert_all_ok(results)
    for v in (r.values for r in results):
        assert "all_reduce(count=32, int64, sum)" in v["table"]
        assert "all_gather(send_count=32, int64)" in v["table"]
        for step, gathered in enumerate(v["sums"]):
            weight = sum(r + step for r in range(4))
            assert gathered == [i * weight for i in range(32)] * 4
