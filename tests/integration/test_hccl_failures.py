"""HCCL failures, the way NCCL users wish NCCL did it: mismatched calls fail every rank at
once with a message naming each rank and what it called; a collective that waits past
HCCL_EXEC_TIMEOUT names the ranks that never came; a rank killed with SIGKILL (or one
that destroyed its communicator) makes the others fail promptly instead of hanging;
communicator init reports bad arguments and missing ranks.

Ranks coordinate through marker files (touch / wait_for), never through timing, except
where a test needs one request to reach the daemon before another (noted there).
"""

from __future__ import annotations

import signal
import time

import pytest
from conftest import DaemonProcess
from hccl_ranks import assert_all_ok, run_ranks

from simnpu.client.tools.query import query
from simnpu.proto import codes
from simnpu.proto import hccl_types as ht

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def daemon3(tmp_path_factory):
    process = DaemonProcess(
        tmp_path_factory.mktemp("hccl-fail"), "--devices", "3", "--memory", "32MiB"
    )
    yield process
    assert process.stop() == 0, process.output()


SYNC = """
def sync_code(stream):
    try:
        stream.synchronize()
    except NpuError as error:
        return error.code, error.message
    return 0, ""
"""

MISMATCH = (
    SYNC
    + """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
buffer = npu.DeviceBuffer(4096 * 4)
count = 2048 if RANK == 1 else 1024
data_type = hccl.HCCL_DATA_TYPE_INT32 if RANK == 2 else hccl.HCCL_DATA_TYPE_FP32
if RANK == 2:
    wait_for("synced0")
    wait_for("synced1")
ret = hccl.all_reduce(buffer.ptr, buffer.ptr, count, data_type, hccl.HCCL_REDUCE_SUM, comm.handle,
                      stream.handle)
assert ret == hccl.HCCL_SUCCESS  # queued: the mismatch is found on the device side
code, message = sync_code(stream)
touch(f"synced{RANK}")
error, ret = hccl.get_comm_async_error(comm.handle)
assert ret == hccl.HCCL_SUCCESS
after = comm.all_reduce_array(np.full(4, RANK + 1, np.float32)).tolist()  # the next one works
p2p_code, p2p_message = 0, ""
if RANK in (0, 1):  # a send/recv pair that disagrees on the count
    if RANK == 0:
        comm.send(buffer, 1, dtype=np.float32, count=10, stream=stream)
    else:
        comm.recv(buffer, 0, dtype=np.float32, count=20, stream=stream)
    p2p_code, p2p_message = sync_code(stream)
report(code=code, message=message, async_error=error, after=after, p2p_code=p2p_code,
       p2p_message=p2p_message)
comm.destroy()
"""
)


def test_mismatch_names_every_rank_and_what_it_called(daemon3, tmp_path):
    results = run_ranks(daemon3.address, 3, MISMATCH, tmp_path, devices=[0, 1, 2])
    assert_all_ok(results)
    values = [r.values for r in results]
    assert [v["code"] for v in values] == [codes.ACL_ERROR_RT_PARAM_INVALID] * 3
    assert [v["async_error"] for v in values] == [ht.HCCL_E_PARA] * 3
    for v in values[:2]:  # ranks 0 and 1 met first: rank 2 had not come yet
        assert "HCCL mismatch at collective #0" in v["message"]
        assert (
            "rank 0 (pid" in v["message"]
            and "called all_reduce(count=1024, fp32, sum)" in v["message"]
        )
        assert (
            "rank 1 (pid" in v["message"]
            and "called all_reduce(count=2048, fp32, sum)" in v["message"]
        )
        assert "rank 2 had not reached it yet" in v["message"]
    assert "rank 2 arrived later with all_reduce(count=1024, int32, sum)" in values[2]["message"]
    assert "called all_reduce(count=2048, fp32, sum)" in values[2]["message"]
    assert [v["after"] for v in values] == [[6.0] * 4] * 3
    for v in values[:2]:
        assert v["p2p_code"] == codes.ACL_ERROR_RT_PARAM_INVALID
        assert "called send(count=10, fp32, to rank 1)" in v["p2p_message"]
        assert "called recv(count=20, fp32, from rank 0)" in v["p2p_message"]


TIMEOUT = (
    SYNC
    + """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
buffer = npu.DeviceBuffer(256)
code, message = 0, ""
if RANK < 2:
    comm.all_reduce(buffer, op="sum", dtype=np.float32, count=16, stream=stream)
    code, message = sync_code(stream)
    touch(f"timed_out{RANK}")
else:  # reaches the collective only after the others gave up on it
    wait_for("timed_out0")
    wait_for("timed_out1")
    comm.all_reduce(buffer, op="sum", dtype=np.float32, count=16, stream=stream)
    code, message = sync_code(stream)
error = comm.async_error()
after = comm.all_reduce_array(np.arange(3, dtype=np.int64)).tolist()
report(code=code, message=message, async_error=error.code if error else 0, after=after)
comm.destroy()
"""
)


def test_exec_timeout_names_the_ranks_that_never_arrived(daemon3, tmp_path):
    # HCCL_EXEC_TIMEOUT counts in the process that creates the root info (rank 0) only
    results = run_ranks(
        daemon3.address,
        3,
        TIMEOUT,
        tmp_path,
        devices=[0, 1, 2],
        env={"HCCL_EXEC_TIMEOUT": "3600"},
        rank_env={0: {"HCCL_EXEC_TIMEOUT": "1"}},
    )
    assert_all_ok(results)
    values = [r.values for r in results]
    assert [v["code"] for v in values] == [codes.ACL_ERROR_RT_TASK_TIMEOUT] * 3
    assert [v["async_error"] for v in values] == [ht.HCCL_E_TIMEOUT] * 3
    for v in values[:2]:
        assert "HCCL_E_TIMEOUT: all_reduce(count=16, fp32, sum) (collective #0" in v["message"]
        assert "waited 1 s (HCCL_EXEC_TIMEOUT" in v["message"]
        assert "rank 2 never arrived; ranks 0, 1 were waiting" in v["message"]
    assert "rank 2 arrived later" in values[2]["message"]
    assert [v["after"] for v in values] == [[0, 3, 6]] * 3


KILLED = (
    SYNC
    + """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
buffer = npu.DeviceBuffer(1024)
if RANK == 2:
    wait_for("queued0")
    wait_for("queued1")
    os.kill(os.getpid(), signal.SIGKILL)
comm.all_reduce(buffer, op="sum", dtype=np.float32, count=64, stream=stream)  # waits for rank 2
touch(f"queued{RANK}")
pending_code, pending_message = sync_code(stream)
comm.broadcast(buffer, root=0, dtype=np.float32, count=64, stream=stream)      # after the death
future_code, future_message = sync_code(stream)
error, ret = hccl.get_comm_async_error(comm.handle)
report(pending_code=pending_code, pending_message=pending_message, future_code=future_code,
       future_message=future_message, async_error=error)
comm.destroy()
"""
)


def test_a_rank_killed_with_sigkill_fails_the_others_promptly(daemon3, tmp_path):
    # the default HCCL_EXEC_TIMEOUT (1836 s) is far beyond the 60 s the ranks get
    results = run_ranks(daemon3.address, 3, KILLED, tmp_path, devices=[0, 1, 2], timeout=60)
    assert results[2].returncode == -signal.SIGKILL, results[2].describe()
    assert_all_ok(results[:2])
    for v in (r.values for r in results[:2]):
        assert v["pending_code"] == codes.ACL_ERROR_RT_COMM_OP_RETRY_FAIL
        assert v["future_code"] == codes.ACL_ERROR_RT_COMM_OP_RETRY_FAIL
        assert v["async_error"] == ht.HCCL_E_REMOTE
        for message in (v["pending_message"], v["future_message"]):
            assert (
                "rank 2 (pid" in message and "ended (its process exited or was killed)" in message
            )
            assert "is broken" in message


DESTROYED = (
    SYNC
    + """
comm = Communicator(N, exchange_root_info(), RANK)
stream = npu.Stream()
if RANK == 1:
    comm.destroy()
    touch("destroyed")
    report(ok=True)
    raise SystemExit(0)
wait_for("destroyed")
buffer = npu.DeviceBuffer(64)
comm.all_reduce(buffer, op="sum", dtype=np.float32, count=4, stream=stream)
code, message = sync_code(stream)
report(code=code, message=message)
comm.destroy()
"""
)


def test_a_rank_that_destroyed_the_communicator_fails_the_others(daemon3, tmp_path):
    results = run_ranks(daemon3.address, 2, DESTROYED, tmp_path, devices=[0, 1])
    assert_all_ok(results)
    assert results[0].values["code"] == codes.ACL_ERROR_RT_COMM_OP_RETRY_FAIL
    assert "rank 1 (pid" in results[0].values["message"]
    assert "destroyed the communicator before submitting it" in results[0].values["message"]


INIT = """
def init(n, info, rank):
    comm, ret = hccl.comm_init_root_info(n, info, rank)
    return comm, ret, hccl.get_recent_err_msg() or ""

if RANK == 0:
    info = exchange_root_info()
    touch("joining")
    comm, ret, message = init(2, info, 0)  # completes when rank 1 joins
    report(ret=ret)
    touch("rank0_done")
elif RANK == 1:
    info = exchange_root_info()
    wait_for("joining")
    time.sleep(1.0)  # rank 0's join must reach the daemon first: the duplicate is this one
    results = {}
    results["duplicate"] = init(2, info, 0)[1:]
    results["n_ranks"] = init(3, info, 1)[1:]
    results["rank_range"] = init(2, info, 5)[1:]
    results["garbage"] = init(2, b"x" * hccl.HCCL_ROOT_INFO_BYTES, 1)[1:]
    results["short"] = init(2, b"x" * 10, 1)[1:]
    comm, ret, message = init(2, info, 1)
    results["join"] = (ret, message)
    n, ret = hccl.get_rank_size(comm)
    rank, ret = hccl.get_rank_id(comm)
    results["size_rank"] = (n, rank)
    wait_for("rank0_done")
    results["reuse"] = init(2, info, 1)[1:]
    report(**results)
else:  # a communicator of 3 of which only this rank ever joins
    os.environ["HCCL_CONNECT_TIMEOUT"] = "1"
    info, ret = hccl.get_root_info()
    report(alone=init(3, info, 0)[1:])
"""


def test_init_errors_and_connect_timeout(daemon3, tmp_path):
    results = run_ranks(daemon3.address, 3, INIT, tmp_path, devices=[0, 1, 2])
    assert_all_ok(results)
    assert results[0].values["ret"] == ht.HCCL_SUCCESS
    got = results[1].values
    assert got["duplicate"][0] == ht.HCCL_E_PARA and "rank 0 of communicator" in got["duplicate"][1]
    assert "already joined by pid" in got["duplicate"][1]
    assert got["n_ranks"][0] == ht.HCCL_E_PARA and "passed n_ranks=3" in got["n_ranks"][1]
    assert "passed n_ranks=2" in got["n_ranks"][1]
    assert got["rank_range"][0] == ht.HCCL_E_PARA
    assert (
        got["garbage"][0] == ht.HCCL_E_PARA and "not a simnpu HCCL root info" in got["garbage"][1]
    )
    assert got["short"][0] == ht.HCCL_E_PARA
    assert got["join"][0] == ht.HCCL_SUCCESS
    assert got["size_rank"] == [2, 1]
    assert got["reuse"][0] == ht.HCCL_E_PARA and "already formed" in got["reuse"][1]
    alone = results[2].values["alone"]
    assert alone[0] == ht.HCCL_E_TIMEOUT
    assert "ranks 1, 2 of 3 never joined" in alone[1] and "HCCL_CONNECT_TIMEOUT" in alone[1]


# One process issues 1,100 root infos nobody joins, then joins some of them alone.
HOARD = """
def init(info):
    comm, ret = hccl.comm_init_root_info(1, info, 0)
    if ret == hccl.HCCL_SUCCESS:
        hccl.comm_destroy(comm)
    return [ret, hccl.get_recent_err_msg()]

infos = []
for _ in range(1100):
    info, ret = hccl.get_root_info()
    assert ret == hccl.HCCL_SUCCESS, ret
    infos.append(info)
report(oldest=init(infos[0]), oldest_kept=init(infos[-1024]), again=init(infos[-1024]),
       kept_for_later=infos[-1].hex())
"""

LATER = """
report(later=list(hccl.comm_init_root_info(1, bytes.fromhex(os.environ["INFO"]), 0)[1:])
       + [hccl.get_recent_err_msg()])
"""


def test_root_infos_nobody_joins_do_not_pile_up_in_the_daemon(daemon3, tmp_path):
    """A session keeps at most 1,024 root infos that nobody joined (its oldest is forgotten
    beyond), and they go with the session: a client issuing root infos in a loop cannot
    grow the daemon without bound."""
    (first,) = run_ranks(daemon3.address, 1, HOARD, tmp_path)
    assert_all_ok([first])
    got = first.values
    assert got["oldest"][0] == ht.HCCL_E_PARA and "was forgotten" in got["oldest"][1]
    assert got["oldest_kept"][0] == ht.HCCL_SUCCESS, got["oldest_kept"]
    assert got["again"][0] == ht.HCCL_E_PARA and "already formed" in got["again"][1]
    deadline = time.monotonic() + 30  # the session's end is handled after its process ends
    while query("devices", address=daemon3.address)["processes"]:
        assert time.monotonic() < deadline, "the first process's session never ended"
        time.sleep(0.05)
    (second,) = run_ranks(daemon3.address, 1, LATER, tmp_path, env={"INFO": got["kept_for_later"]})
    assert_all_ok([second])
    ret, message = second.values["later"]
    assert ret == ht.HCCL_E_PARA and "its process ended before any rank joined" in message
