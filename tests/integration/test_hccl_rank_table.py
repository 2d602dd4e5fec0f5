"""HcclCommInitClusterInfo against a real daemon: the ranks of a rank table file form one
communicator (rank ids mapped to their devices as the table says), the same table forms a
new one after, and what HCCL refuses is refused with its HcclResult, by the client and by
the daemon, which goes on serving."""

from __future__ import annotations

import json

import pytest
from hccl_ranks import assert_all_ok, run_ranks

pytestmark = pytest.mark.multiprocess


def write_table(path, devices_of_ranks, servers=1, status="completed") -> str:
    """A version 1.0 rank table: rank r on device devices_of_ranks[r], the ranks split over
    `servers` servers in order."""
    per_server = len(devices_of_ranks) // servers
    server_list = []
    for server in range(servers):
        ranks = range(server * per_server, (server + 1) * per_server)
        server_list.append(
            {
                "server_id": f"node_{server}",
                "device": [
                    {
                        "device_id": str(devices_of_ranks[r]),
                        "device_ip": f"192.168.{server}.{r + 1}",
                        "rank_id": str(r),
                    }
                    for r in ranks
                ],
            }
        )
    table = {
        "status": status,
        "version": "1.0",
        "server_count": str(servers),
        "server_list": server_list,
    }
    path.write_text(json.dumps(table, indent=2))
    return str(path)


# Twice from the same table: the Pythonic API, then the hccl facade; an all_reduce each.
WORLD = """
TABLE = os.environ["RANK_TABLE"]
with Communicator.from_rank_table(TABLE, RANK) as comm:
    total = comm.all_reduce_array(np.full(1000, RANK + 1, np.float32))
    first = dict(rank=comm.rank, size=comm.size, device=comm.device, name=comm.name,
                 total=float(total[0]), same=bool((total == total[0]).all()))
comm, ret = hccl.comm_init_cluster_info(TABLE, RANK)
assert ret == hccl.HCCL_SUCCESS, (ret, hccl.get_recent_err_msg())
rank, ret = hccl.get_rank_id(comm)
size, ret = hccl.get_rank_size(comm)
name, ret = hccl.get_comm_name(comm)
send = npu.DeviceBuffer.from_array(np.full(8, RANK, np.int64))
recv = npu.DeviceBuffer(64)
stream = npu.Stream()
ret = hccl.all_reduce(int(send), int(recv), 8, hccl.HCCL_DATA_TYPE_INT64, hccl.HCCL_REDUCE_MAX,
                      comm, stream.handle)
assert ret == hccl.HCCL_SUCCESS, ret
stream.synchronize()
report(first=first, rank=rank, size=size, second_name=name,
       max=int(recv.to_numpy(np.int64)[0]))
assert hccl.comm_destroy(comm) == hccl.HCCL_SUCCESS
"""


def test_the_ranks_of_a_table_form_one_communicator_twice(daemon4, tmp_path):
    devices = [2, 0, 3, 1]  # rank r on device devices[r]
    table = write_table(tmp_path / "rank_table.json", devices)
    results = run_ranks(
        daemon4.address, 4, WORLD, tmp_path, devices=devices, env={"RANK_TABLE": table}
    )
    assert_all_ok(results)
    names = set()
    for result in results:
        values = result.values
        first = values["first"]
        assert (first["rank"], first["size"], first["device"]) == (
            result.rank,
            4,
            devices[result.rank],
        )
        assert first["total"] == 1 + 2 + 3 + 4 and first["same"]
        assert (values["rank"], values["size"], values["max"]) == (result.rank, 4, 3)
        names.update({first["name"], values["second_name"]})
    assert len(names) == 2, names  # two communicators, each the same on every rank


# One process, device 0; each case reports (ret, message).
REFUSED = """
import threading
from simnpu.client import hcclrt
from simnpu.client.device import runtime
from simnpu.proto import npu_pb2 as pb

def attempt(path, rank=0):
    comm, ret = hccl.comm_init_cluster_info(path, rank)
    if ret == hccl.HCCL_SUCCESS:
        hccl.comm_destroy(comm)
    return [ret, hccl.get_recent_err_msg()]

def raw(text):
    try:
        hcclrt.of(runtime()).call(pb.HcclCommInitClusterRequest(
            rank_table=text, rank=0, device=0, connect_timeout_ms=1000, exec_timeout_ms=-1))
    except hcclrt.HcclError as error:
        return [error.code, error.message]
    return [0, ""]

tables = json.loads(os.environ["TABLES"])
out = {name: attempt(path) for name, path in tables.items() if name != "later"}
out["none"] = attempt(None)
out["rank_outside"] = attempt(tables["one"], 1)
# a table written "initializing" first is waited for, re-read every second
later = tables["later"]
def complete():
    time.sleep(1.5)
    with open(later) as handle:
        text = handle.read()
    with open(later + ".tmp", "w") as handle:
        handle.write(text.replace('"initializing"', '"completed"'))
    os.replace(later + ".tmp", later)
writer = threading.Thread(target=complete)
writer.start()
out["later"] = attempt(later)
writer.join()
# what the client would not send, the daemon refuses too
out["raw_not_json"] = raw("{")
with open(tables["one"]) as handle:
    one = handle.read()
out["raw_initializing"] = raw(one.replace('"completed"', '"initializing"'))
with open(tables["two_servers"]) as handle:
    out["raw_rank_on_device_1"] = raw(handle.read().replace('"device_id": "0"', '"device_id": "1"'))
out["after"] = attempt(tables["one"])  # the daemon still forms worlds
report(**out)
"""


def test_what_hccl_refuses_is_refused_and_the_daemon_goes_on(daemon4, tmp_path):
    tables = {
        "one": write_table(tmp_path / "one.json", [0]),
        "missing": str(tmp_path / "missing.json"),
        "not_json_name": str(tmp_path / "one.txt"),
        "other_device": write_table(tmp_path / "other.json", [1]),
        "two_servers": write_table(tmp_path / "two.json", [0, 0], servers=2),
        "alone": write_table(tmp_path / "alone.json", [0, 1]),
        "later": write_table(tmp_path / "later.json", [0], status="initializing"),
    }
    (tmp_path / "one.txt").write_text((tmp_path / "one.json").read_text())
    (result,) = run_ranks(
        daemon4.address,
        1,
        REFUSED,
        tmp_path,
        env={"TABLES": json.dumps(tables), "HCCL_CONNECT_TIMEOUT": "1"},
    )
    assert_all_ok([result])
    out = result.values
    HCCL_SUCCESS, HCCL_E_PARA, HCCL_E_PTR, HCCL_E_INTERNAL = 0, 1, 2, 4
    HCCL_E_UNAVAIL, HCCL_E_TIMEOUT = 7, 9
    assert out["one"][0] == HCCL_SUCCESS, out["one"]
    assert out["missing"][0] == HCCL_E_INTERNAL and "missing.json" in out["missing"][1]
    assert out["not_json_name"][0] == HCCL_E_INTERNAL and ".json" in out["not_json_name"][1]
    assert out["other_device"][0] == HCCL_E_UNAVAIL
    assert "rank 0 is on device 1" in out["other_device"][1]
    assert out["two_servers"][0] == HCCL_E_PARA  # from the daemon: where is each server's?
    assert "no daemon address for server node_0, node_1" in out["two_servers"][1]
    assert out["alone"][0] == HCCL_E_TIMEOUT  # rank 1 never came
    assert "rank 1 of 2 never joined" in out["alone"][1]
    assert out["none"][0] == HCCL_E_PTR
    assert out["rank_outside"][0] == HCCL_E_PARA
    assert out["later"][0] == HCCL_SUCCESS, out["later"]
    assert out["raw_not_json"][0] == HCCL_E_INTERNAL
    assert out["raw_initializing"][0] == HCCL_E_PARA
    assert "'initializing', not 'completed'" in out["raw_initializing"][1]
    assert out["raw_rank_on_device_1"][0] == HCCL_E_UNAVAIL
    assert out["after"][0] == HCCL_SUCCESS, out["after"]
