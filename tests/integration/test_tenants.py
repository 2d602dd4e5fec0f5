"""Tenants on TCP (docs/security.md, server/core/tenants.py) against a real daemon whose token
file names the operator and two tenants, alice and bob: a job name, a root info and a rank
table are their tenant's, so bob cannot take a rank in alice's world; each tenant sees only
its own processes, jobs and memory; only the operator's token links daemons.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import grpc
import pytest
from test_hccl_rank_table import write_table

from simnpu.client.tools.query import ToolError, query
from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2, service

pytestmark = pytest.mark.multiprocess

TOKENS = {"operator": "op-secret-token", "alice": "alice-secret-token", "bob": "bob-secret-token"}

# One rank of job argv[1] (size 2): rendezvous, a communicator, an all_reduce of rank + 1.
JOB_RANK = """
import json, os, sys
import numpy as np
import simnpu.client as npu
from simnpu.client.collectives import Communicator
from simnpu.client.rendezvous import rendezvous

npu.Device(0)
me = rendezvous(sys.argv[1], 2)
with Communicator(me.world_size, me.root_info, me.rank) as comm:
    total = comm.all_reduce_array(np.array([me.rank + 1], np.int64))
print(json.dumps({"rank": me.rank, "total": int(total[0]), "pid": os.getpid()}))
"""

# Prints the root info it was issued (hex), then holds it until stdin closes.
ROOT_HOLDER = """
import sys
import simnpu.client as npu
from simnpu.client.collectives import get_root_info

npu.Device(0)
print(get_root_info().hex(), flush=True)
sys.stdin.read()
"""

# Joins as rank argv[2] of 2 with the root info argv[1] (hex); prints the outcome.
JOINER = """
import json, os, sys
import hccl
import simnpu.client as npu

npu.Device(0)
comm, ret = hccl.comm_init_root_info(2, bytes.fromhex(sys.argv[1]), int(sys.argv[2]))
print(json.dumps({"ret": ret, "message": hccl.get_recent_err_msg(), "pid": os.getpid()}))
"""

# Allocates 1 MiB, prints its pointer and its own view of the device's blocks, then waits.
HOLDER = """
import json, os, sys
import simnpu.client as npu

npu.Device(0)
buffer = npu.DeviceBuffer(1 << 20)
rt = npu.runtime()
pids = sorted({b["pid"] for b in rt.memory.memory_snapshot(0)})
print(json.dumps({"ptr": int(buffer.ptr), "pid": os.getpid(), "sees_pids": pids}), flush=True)
sys.stdin.read()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def tenants_daemon(start_daemon, tmp_path):
    """A TCP daemon with the operator's token and alice's and bob's."""
    token_file = tmp_path / "tokens"
    token_file.write_text(
        "# the operator first, then a tenant per line\n"
        f"{TOKENS['operator']}\nalice {TOKENS['alice']}\nbob {TOKENS['bob']}\n"
    )
    token_file.chmod(0o600)
    address = f"127.0.0.1:{free_port()}"
    env = {"SIMNPU_TOKEN": "", "SIMNPU_TOKEN_FILE": ""}
    return start_daemon(
        "--listen", address, "--token-file", token_file, "--devices", "2", env=env, address=address
    )


def spawn(daemon, tenant: str, code: str, *args, env=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "SIMNPU_ADDRESS": daemon.address,
            "SIMNPU_TOKEN": TOKENS[tenant],
            **(env or {}),
        },
    )


def finish(process: subprocess.Popen, timeout: float = 90) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return json.loads(out.splitlines()[-1])


@contextlib.contextmanager
def issued_root_info(daemon, tenant: str):
    """A root info (hex) that a process of `tenant` was issued and holds while in the
    block."""
    holder = spawn(daemon, tenant, ROOT_HOLDER)
    try:
        info = holder.stdout.readline().strip()
        assert info, holder.stderr.read()
        yield info
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0


def ask(daemon, tenant: str, what: str = ""):
    return query(what, address=daemon.address, token=TOKENS[tenant])


def wait_for(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_job_name_is_its_tenants(tenants_daemon):
    """bob asks for alice's job name first; alice's two ranks still form their world
    together (bob was rank 0 of it before tenants), and bob's wait times out alone."""
    intruder = spawn(
        tenants_daemon,
        "bob",
        "import hccl, simnpu.client as npu\nnpu.Device(0)\n"
        "rank, info, ret = hccl.rendezvous('train', 2)\nprint(ret, flush=True)",
        env={"HCCL_CONNECT_TIMEOUT": "20"},
    )
    try:
        wait_for(lambda: ask(tenants_daemon, "bob", "jobs").get("train"), "bob to wait")
        ranks = [spawn(tenants_daemon, "alice", JOB_RANK, "train")]
        first = wait_for(lambda: ask(tenants_daemon, "alice", "jobs").get("train"), "alice")
        # each tenant sees its own job under its name; the operator sees both, by tenant
        assert first["waiting"] == [ranks[0].pid]
        assert ask(tenants_daemon, "bob", "jobs")["train"]["waiting"] == [intruder.pid]
        everyone = ask(tenants_daemon, "operator", "jobs")
        assert everyone["train (token bob)"]["waiting"] == [intruder.pid]
        assert everyone["train (token alice)"]["waiting"] == [ranks[0].pid]
        ranks.append(spawn(tenants_daemon, "alice", JOB_RANK, "train"))
        results = [finish(rank) for rank in ranks]
    finally:
        out, _ = intruder.communicate(timeout=60)
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert {r["pid"] for r in results} == {rank.pid for rank in ranks}
    assert all(r["total"] == 3 for r in results)  # 1 + 2: nobody else's values
    assert int(out.split()[0]) == ht.HCCL_E_TIMEOUT


def test_another_tenants_root_info_does_not_let_a_rank_in(tenants_daemon):
    """bob presents alice's root info, and his own with alice's communicator id: both are
    refused, and alice's two ranks then form their world."""
    with issued_root_info(tenants_daemon, "alice") as alice_info:
        leaked = finish(spawn(tenants_daemon, "bob", JOINER, alice_info, 1))
        assert leaked["ret"] == ht.HCCL_E_PARA and "another tenant" in leaked["message"]

        with issued_root_info(tenants_daemon, "bob") as own:
            bob_info = bytearray.fromhex(own)
            comm_id = slice(20, 28)  # after the magic and the version (ROOT_LAYOUT)
            bob_info[comm_id] = bytes.fromhex(alice_info)[comm_id]
            forged = finish(spawn(tenants_daemon, "bob", JOINER, bob_info.hex(), 1))
        assert forged["ret"] == ht.HCCL_E_PARA and "made up" in forged["message"]

        # the world is still alice's to form: her two ranks join it
        joiners = [spawn(tenants_daemon, "alice", JOINER, alice_info, r) for r in (0, 1)]
        assert [finish(j)["ret"] for j in joiners] == [ht.HCCL_SUCCESS] * 2


def test_a_rank_table_is_its_tenants(tenants_daemon, tmp_path):
    """Ranks of alice and bob joining with the same rank table form two communicators: bob's
    rank 1 does not complete alice's."""
    table = write_table(tmp_path / "table.json", [0, 1])  # rank r on device r
    join = (
        "import json, sys, hccl, simnpu.client as npu\nnpu.Device(int(sys.argv[2]))\n"
        "comm, ret = hccl.comm_init_cluster_info(sys.argv[1], int(sys.argv[2]))\n"
        "print(json.dumps({'ret': ret, 'message': hccl.get_recent_err_msg()}))"
    )
    alice0 = spawn(tenants_daemon, "alice", join, table, 0, env={"HCCL_CONNECT_TIMEOUT": "8"})
    bob1 = spawn(tenants_daemon, "bob", join, table, 1, env={"HCCL_CONNECT_TIMEOUT": "8"})
    alice, bob = finish(alice0), finish(bob1)
    assert alice["ret"] == bob["ret"] == ht.HCCL_E_TIMEOUT, (alice, bob)
    assert "rank 1" in alice["message"] and "rank 0" in bob["message"]


def test_a_tenant_sees_only_its_own_processes_and_memory(tenants_daemon):
    alice = spawn(tenants_daemon, "alice", HOLDER)
    bob = spawn(tenants_daemon, "bob", HOLDER)
    try:
        mine = {
            name: json.loads(p.stdout.readline()) for name, p in (("alice", alice), ("bob", bob))
        }
        # the second to allocate was the only one whose own view could hold the other's block
        assert mine["alice"]["sees_pids"] == [alice.pid]
        assert mine["bob"]["sees_pids"] == [bob.pid]

        processes = ask(tenants_daemon, "bob")["processes"]
        assert [(p["pid"], p["tenant"]) for p in processes] == [(bob.pid, "token bob")]
        blocks = ask(tenants_daemon, "bob", "memory_snapshot")
        assert {b["pid"] for b in blocks} == {bob.pid}
        assert mine["alice"]["ptr"] not in {b["address"] for b in blocks}
        with pytest.raises(ToolError, match="only the operator"):
            ask(tenants_daemon, "bob", "trace")

        everyone = {p["pid"] for p in ask(tenants_daemon, "operator")["processes"]}
        assert {alice.pid, bob.pid} <= everyone
        blocks = ask(tenants_daemon, "operator", "memory_snapshot")
        assert {alice.pid, bob.pid} <= {b["pid"] for b in blocks}
    finally:
        for process in (alice, bob):
            process.communicate("", timeout=60)
            assert process.returncode == 0


def peer_stream(address: str, metadata: tuple) -> list | grpc.StatusCode:
    """Open a Peer stream (a member daemon's job stream) at `address` with `metadata`:
    what it answered, or the status it was refused with."""
    hello = npu_pb2.PeerMessage(hello=npu_pb2.PeerHello(jobs=True, address="127.0.0.1:1"))
    with grpc.insecure_channel(address) as channel:
        peer = channel.stream_stream(
            f"/{service.SERVICE}/Peer",
            request_serializer=npu_pb2.PeerMessage.SerializeToString,
            response_deserializer=npu_pb2.PeerMessage.FromString,
        )
        try:
            return list(peer(iter([hello]), metadata=metadata, timeout=30))
        except grpc.RpcError as error:
            return error.code()


def test_only_the_operators_token_links_daemons(tenants_daemon):
    """A Peer stream speaks for any tenant's ranks: a tenant's token is refused; the
    operator's opens one (a job stream to this seed, which ends with its messages)."""
    outcomes = {
        tenant: peer_stream(tenants_daemon.address, ((service.TOKEN_METADATA_KEY, TOKENS[tenant]),))
        for tenant in ("bob", "operator")
    }
    assert outcomes == {"bob": grpc.StatusCode.PERMISSION_DENIED, "operator": []}


@pytest.fixture
def tenant_hosts(start_daemon, tmp_path):
    """Two daemons ("hosts" a and b) on loopback TCP that advertise their addresses, with
    the same token file: the operator, alice and bob."""
    token_file = tmp_path / "tokens"
    token_file.write_text(f"{TOKENS['operator']}\nalice {TOKENS['alice']}\nbob {TOKENS['bob']}\n")
    hosts = []
    for _ in range(2):
        address = f"127.0.0.1:{free_port()}"
        hosts.append(
            start_daemon(
                "--listen",
                address,
                "--advertise",
                address,
                "--token-file",
                token_file,
                env={"SIMNPU_TOKEN": "", "SIMNPU_TOKEN_FILE": ""},
                address=address,
            )
        )
    return hosts


def test_across_hosts_a_root_info_and_a_job_stay_their_tenants(tenant_hosts):
    """The coordinator refuses bob's rank, joining from host b with alice's root info of
    host a; alice's ranks on both hosts form her world. Arrivals forwarded to a job's seed
    keep their tenant: bob's "train" at host b does not complete alice's at host a."""
    a, b = tenant_hosts
    with issued_root_info(a, "alice") as info:
        intruder = finish(spawn(b, "bob", JOINER, info, 1))
        assert intruder["ret"] == ht.HCCL_E_PARA and "another tenant" in intruder["message"]
        joiners = [spawn(a, "alice", JOINER, info, 0), spawn(b, "alice", JOINER, info, 1)]
        assert [finish(j)["ret"] for j in joiners] == [ht.HCCL_SUCCESS] * 2

    seed = {"SIMNPU_JOB_SEED": a.address}
    bob = spawn(b, "bob", JOB_RANK, "train", env={**seed, "HCCL_CONNECT_TIMEOUT": "20"})
    try:
        wait_for(lambda: ask(a, "operator", "jobs").get("train (token bob)"), "bob at the seed")
        ranks = [spawn(host, "alice", JOB_RANK, "train", env=seed) for host in (a, b)]
        results = [finish(rank) for rank in ranks]
    finally:
        _, err = bob.communicate(timeout=60)
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert all(r["total"] == 3 for r in results)
    assert bob.returncode != 0 and "1 of 2 processes had arrived" in err  # alone, timed out


NOBODY = 65534
SETPRIV = shutil.which("setpriv") or "setpriv"


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="runs a client as another uid: needs root and setpriv (util-linux)",
)
def test_another_uid_on_the_unix_socket_has_job_names_of_its_own(start_daemon):
    """On a Unix socket the daemon's file mode opens to every user, uid 65534's job "train"
    is not the operator's: it waits alone, and the operator's two processes form theirs."""
    folder = tempfile.mkdtemp(prefix="simnpu-tenants-")
    try:
        os.chmod(folder, 0o755)
        tcp = f"127.0.0.1:{free_port()}"  # (and TCP: a daemon that takes Peer streams)
        daemon = start_daemon(
            "--listen",
            tcp,
            "--advertise",
            tcp,
            env={"SIMNPU_TOKEN": TOKENS["operator"]},
            address=f"unix://{folder}/npu.sock",
        )
        for name in os.listdir(folder):  # the session and credentials sockets
            os.chmod(os.path.join(folder, name), 0o666)
        rendezvous = (
            "import hccl, json, os\n"
            "rank, info, ret = hccl.rendezvous('train', 2)\n"
            "print(json.dumps({'ret': ret, 'rank': rank, 'pid': os.getpid()}))"
        )
        env = {"SIMNPU_ADDRESS": daemon.address}
        operator = spawn_as(None, rendezvous, env)
        wait_for(lambda: query("jobs", address=daemon.address).get("train"), "the operator")
        other = spawn_as(NOBODY, rendezvous, {**env, "HCCL_CONNECT_TIMEOUT": "3"})
        waiting = wait_for(
            lambda: query("jobs", address=daemon.address).get(f"train (uid {NOBODY})"), "uid"
        )
        assert waiting["waiting"] == [other.pid]
        # the tool as that uid sees its own job only; a query without a ticket, none
        look = (
            "import json; from simnpu.client.tools.query import query; "
            "print(json.dumps(query('jobs')))"
        )
        seen = spawn_as(NOBODY, look, env).communicate(timeout=60)[0]
        assert json.loads(seen) == {"train": {"world_size": 2, "waiting": [other.pid]}}
        assert unverified_jobs(daemon.address) == {}
        assert peer_stream(daemon.address, ()) == grpc.StatusCode.PERMISSION_DENIED
        assert finish(other)["ret"] == ht.HCCL_E_TIMEOUT
        second = spawn_as(None, rendezvous, env)
        results = [finish(operator), finish(second)]
        assert sorted(r["rank"] for r in results) == [0, 1]
        assert all(r["ret"] == ht.HCCL_SUCCESS for r in results)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def unverified_jobs(address: str) -> dict:
    """The "jobs" query without a credentials ticket."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            service.QUERY_METHOD,
            request_serializer=npu_pb2.QueryRequest.SerializeToString,
            response_deserializer=npu_pb2.QueryReply.FromString,
        )
        return json.loads(call(npu_pb2.QueryRequest(what="jobs"), timeout=30).json)


def spawn_as(uid: int | None, code: str, env: dict) -> subprocess.Popen:
    """`code` in a new Python process, as `uid` (None: this process's; else by setpriv)."""
    become = [] if uid is None else [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return subprocess.Popen(
        [*become, sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_TOKEN": "", **env},
    )
