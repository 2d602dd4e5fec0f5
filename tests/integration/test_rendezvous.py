"""The job rendezvous (server/hccl/job_rendezvous.py, a simnpu extension) against a real daemon:
identical processes present (job, world size) and get distinct ranks and one root info
that forms a working communicator; a process that dies while waiting gives up its place;
disagreeing world sizes, bad arguments and timeouts fail with HCCL codes. Also the
data-parallel example as one rank of a job, as the containers run it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import DaemonProcess, run_client

import hccl
from simnpu.server.hccl.job_rendezvous import JOBS_COUNTED

pytestmark = pytest.mark.multiprocess

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "hccl_data_parallel.py")

# One rank: rendezvous, its own device (rank % devices), a communicator from the root info,
# an all_reduce; prints one JSON line.
RANK = """
import json, os, sys
import numpy as np
import simnpu.client as npu
from simnpu.client.collectives import Communicator
from simnpu.client.rendezvous import rendezvous

me = rendezvous(sys.argv[1], int(sys.argv[2]))
device = me.rank % npu.device_count()
npu.Device(device)
with Communicator(me.world_size, me.root_info, me.rank) as comm:
    total = comm.all_reduce_array(np.array([me.rank + 1], np.int64))
    print(json.dumps({"rank": me.rank, "size": me.world_size, "device": comm.device,
                      "job": me.job, "formation": me.formation, "root": me.root_info.hex(),
                      "total": int(total[0]), "pid": os.getpid()}))
"""

# Rendezvous only, through the hccl facade; prints (rank, len(root_info), ret, message).
FACADE = """
import sys
import hccl
rank, root_info, ret = hccl.rendezvous(sys.argv[1], int(sys.argv[2]))
print(rank, len(root_info), ret, hccl.get_recent_err_msg())
"""


@pytest.fixture(scope="module")
def daemon2(tmp_path_factory):
    """A daemon with 2 devices: 4 ranks use devices 0, 1, 0, 1."""
    process = DaemonProcess(tmp_path_factory.mktemp("rdzv"), "--devices", "2", "--memory", "64MiB")
    yield process
    assert process.stop() == 0, process.output()


def spawn(daemon, *argv, env=None) -> subprocess.Popen:
    """`python *argv` as a client of `daemon` (argv: "-c", CODE, args... or a script)."""
    return subprocess.Popen(
        [sys.executable, *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address, **(env or {})},
    )


def finish(process, timeout=90):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out


def query(daemon, what):
    from simnpu.client.tools.query import query

    return query(what, address=daemon.address)


def wait_until(condition, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def waiting_pids(daemon, job) -> list[int]:
    """The pids the daemon has waiting in `job` (the Query RPC's "jobs" view)."""
    return query(daemon, "jobs").get(job, {}).get("waiting", [])


def test_identical_processes_get_distinct_ranks_and_a_working_communicator(daemon2):
    ranks = [spawn(daemon2, "-c", RANK, "train", 4) for _ in range(4)]
    results = [json.loads(finish(p)) for p in ranks]
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    assert {r["size"] for r in results} == {4}
    assert len({r["root"] for r in results}) == 1  # one root info for all
    assert {r["total"] for r in results} == {1 + 2 + 3 + 4}  # the communicator works
    assert {r["rank"]: r["device"] for r in results} == {0: 0, 1: 1, 2: 0, 3: 1}  # rank % devices
    assert {r["job"] for r in results} == {"train"}


def test_the_job_name_forms_a_new_communicator_once_the_last_is_complete(daemon2):
    first = [spawn(daemon2, "-c", RANK, "again", 2) for _ in range(2)]
    first = [json.loads(finish(p)) for p in first]
    second = [spawn(daemon2, "-c", RANK, "again", 2) for _ in range(2)]
    second = [json.loads(finish(p)) for p in second]
    assert {r["formation"] for r in first} == {1} and {r["formation"] for r in second} == {2}
    assert first[0]["root"] != second[0]["root"]  # a new communicator id
    assert sorted(r["rank"] for r in second) == [0, 1]


def test_the_daemon_counts_the_formations_of_its_latest_job_names_only(daemon2):
    """Every job name that formed a communicator used to be remembered for good: a daemon
    serving jobs of fresh names grew without bound. It counts the last JOBS_COUNTED."""
    code = f"""
import simnpu.client as npu
from simnpu.client.rendezvous import rendezvous
npu.Device(0)
first = [rendezvous(name, 1).formation for name in ("oldest", "recent")]
for n in range({JOBS_COUNTED} - 1):
    rendezvous(f"filler-{{n}}", 1)
recent = rendezvous("recent", 1).formation  # formed again: the most recent
for n in range({JOBS_COUNTED} - 1, {JOBS_COUNTED} + 1):
    rendezvous(f"filler-{{n}}", 1)
print(first, recent, rendezvous("recent", 1).formation, rendezvous("oldest", 1).formation)
"""
    result = run_client(daemon2.address, code)
    # "oldest" was pushed out by JOBS_COUNTED newer names and starts over; "recent" was not
    assert result.stdout.split("]", 1)[1].split() == ["2", "3", "1"], result.stderr
    assert result.stdout.startswith("[1, 1]"), result.stdout


def test_other_jobs_do_not_mix(daemon2):
    processes = [spawn(daemon2, "-c", RANK, job, 2) for job in ("a", "b", "a", "b")]
    results = [json.loads(finish(p)) for p in processes]
    for job in ("a", "b"):
        mine = [r for r in results if r["job"] == job]
        assert sorted(r["rank"] for r in mine) == [0, 1]
        assert len({r["root"] for r in mine}) == 1
    assert {r["root"] for r in results if r["job"] == "a"} != {
        r["root"] for r in results if r["job"] == "b"
    }


def test_a_process_that_dies_while_waiting_gives_up_its_place(daemon2):
    doomed = spawn(daemon2, "-c", RANK, "replace", 2)
    wait_until(lambda: waiting_pids(daemon2, "replace") == [doomed.pid], "it waits in the job")
    assert query(daemon2, "jobs")["replace"]["world_size"] == 2
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate(timeout=30)
    wait_until(lambda: "replace" not in query(daemon2, "jobs"), "the daemon saw it go")
    ranks = [spawn(daemon2, "-c", RANK, "replace", 2) for _ in range(2)]
    results = [json.loads(finish(p)) for p in ranks]
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert {r["total"] for r in results} == {3}
    assert doomed.pid not in {r["pid"] for r in results}


def test_a_different_world_size_is_refused_naming_who_waits(daemon2):
    waiting = spawn(daemon2, "-c", FACADE, "mixed", 3, env={"HCCL_CONNECT_TIMEOUT": "3"})
    wait_until(lambda: waiting_pids(daemon2, "mixed") == [waiting.pid], "it waits in the job")
    other = finish(spawn(daemon2, "-c", FACADE, "mixed", 2))
    _, size, ret, message = other.split(" ", 3)
    assert (int(ret), int(size)) == (hccl.HCCL_E_PARA, 0), other
    assert f"pid {waiting.pid} (world size 3)" in message
    assert waiting_pids(daemon2, "mixed") == [waiting.pid]  # the first one still waits
    out = finish(waiting)  # and times out alone
    _, _, ret, message = out.split(" ", 3)
    assert int(ret) == hccl.HCCL_E_TIMEOUT, out
    assert "job 'mixed'" in message and "1 of 3 processes had arrived" in message
    assert "mixed" not in query(daemon2, "jobs")


@pytest.mark.parametrize("job, size", [("", 2), ("x", 0), ("x" * 300, 2), ("bad\nname", 2)])
def test_bad_arguments_are_hccl_e_para(daemon2, job, size):  # the last two: checked by the daemon
    result = run_client(
        daemon2.address,
        f"""
        import hccl
        print(hccl.rendezvous({job!r}, {size}), hccl.get_recent_err_msg())
    """,
    )
    import hccl

    assert f"(0, b'', {hccl.HCCL_E_PARA})" in result.stdout, result.stdout + result.stderr


def test_a_world_size_over_the_limit_is_refused_by_the_daemon(daemon2):
    result = run_client(
        daemon2.address,
        """
        import simnpu.client as npu
        from simnpu.proto import npu_pb2
        from simnpu.proto.errors import NpuError
        try:
            npu.runtime().connection.call(npu_pb2.HcclRendezvousRequest(
                job="x", world_size=5000, exec_timeout_ms=-1, timeout_ms=1000))
        except NpuError as error:
            print(error.code, error.message)
    """,
    )
    assert result.stdout.startswith(f"{hccl.HCCL_E_PARA} job 'x': world size 5000"), result.stdout


def test_the_example_as_ranks_of_a_job_with_and_without_shared_memory(daemon2):
    env = {"SIMNPU_JOB": "example", "SIMNPU_WORLD_SIZE": "2"}
    ranks = [
        spawn(daemon2, EXAMPLE, env=env),
        spawn(daemon2, EXAMPLE, env={**env, "SIMNPU_NO_SHM": "1"}),
    ]
    outputs = [finish(p, timeout=120) for p in ranks]
    assert "uses_shared_memory=True" in outputs[0] and "uses_shared_memory=False" in outputs[1]
    for out in outputs:
        assert "every rank's weights identical bit for bit: True" in out
        assert out.strip().endswith("ok")
    ranks = [re.search(r"^rank (\d)/2 of job 'example'", out, re.MULTILINE)[1] for out in outputs]
    assert sorted(ranks) == ["0", "1"]
