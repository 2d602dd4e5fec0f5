"""Run HCCL ranks as separate client processes of one daemon (helper of test_hccl*.py).

Each rank is a fresh `python -c` process running PRELUDE + the test's body with RANK, N
and DEVICE set and the device bound; rank 0 writes the root info to a file the others
read (the out-of-band exchange HCCL leaves to the user). A rank reports values with
report(...) and coordinates with others through touch()/wait_for() on marker files.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

PRELUDE = """
import json, os, signal, sys, time
import numpy as np
import hccl
import simnpu.client as npu
from simnpu.client.collectives import Communicator, get_root_info
from simnpu.proto.errors import NpuError

RANK = int(os.environ["HCCL_TEST_RANK"])
N = int(os.environ["HCCL_TEST_N"])
DEVICE = int(os.environ["HCCL_TEST_DEVICE"])
DIR = os.environ["HCCL_TEST_DIR"]
npu.Device(DEVICE)


def touch(name):
    with open(os.path.join(DIR, name + ".tmp"), "w") as handle:
        handle.write("1")
    os.replace(os.path.join(DIR, name + ".tmp"), os.path.join(DIR, name))


def wait_for(name, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(os.path.join(DIR, name)):
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {RANK}: {name} never appeared")
        time.sleep(0.01)


def exchange_root_info(name="root_info", issuer=0):
    # the root info rank `issuer` gets from its daemon, handed to every rank (file `name`)
    path = os.path.join(DIR, name)
    if RANK == issuer:
        info, ret = hccl.get_root_info()
        assert ret == hccl.HCCL_SUCCESS, ret
        with open(path + ".tmp", "wb") as handle:
            handle.write(info)
        os.replace(path + ".tmp", path)
        return info
    wait_for(name)
    with open(path, "rb") as handle:
        return handle.read()


def report(**values):
    print("RESULT " + json.dumps(values), flush=True)


def report_synchronize(stream, comm):
    # synchronize `stream`: report code 0, or the error's code and message and the
    # communicator's async error
    try:
        stream.synchronize()
        report(code=0)
    except NpuError as error:
        pending = comm.async_error()
        report(code=error.code, message=error.message, async_error=pending and pending.code)
"""

_runs = itertools.count()


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str

    @property
    def values(self) -> dict:
        found = {}
        for line in self.stdout.splitlines():
            if line.startswith("RESULT "):
                found.update(json.loads(line[len("RESULT ") :]))
        return found

    def describe(self) -> str:
        return f"--- rank {self.rank} exited {self.returncode}\n{self.stdout}\n{self.stderr}"


def run_ranks(
    address: str,
    n: int,
    body: str,
    directory,
    devices=None,
    env=None,
    rank_env=None,
    timeout: float = 90.0,
) -> list[RankResult]:
    """Run `n` rank processes of `body` against the daemon at `address`; wait for all.
    `devices[r]` is rank r's device (default: all on device 0). Kills them all on timeout."""
    run_dir = os.path.join(str(directory), f"ranks{next(_runs)}")
    os.makedirs(run_dir)
    code = PRELUDE + textwrap.dedent(body)
    processes, files = [], []
    for rank in range(n):
        out = open(os.path.join(run_dir, f"{rank}.out"), "w+")
        err = open(os.path.join(run_dir, f"{rank}.err"), "w+")
        files.append((out, err))
        rank_vars = {
            "HCCL_TEST_RANK": str(rank),
            "HCCL_TEST_N": str(n),
            "HCCL_TEST_DIR": run_dir,
            "HCCL_TEST_DEVICE": str(devices[rank] if devices else 0),
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                stdout=out,
                stderr=err,
                env={
                    **os.environ,
                    "SIMNPU_ADDRESS": address,
                    "SIMNPU_AUTOSTART": "0",
                    **(env or {}),
                    **((rank_env or {}).get(rank, {})),
                    **rank_vars,
                },
            )
        )
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        for process in processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    results = []
    for rank, (process, (out, err)) in enumerate(zip(processes, files)):
        out.seek(0)
        err.seek(0)
        results.append(RankResult(rank, process.returncode, out.read(), err.read()))
        out.close()
        err.close()
    if timed_out:
        raise AssertionError(
            f"ranks did not finish within {timeout} s:\n" + "\n".join(r.describe() for r in results)
        )
    return results


def assert_all_ok(results: list[RankResult]) -> None:
    failed = [r for r in results if r.returncode != 0]
    assert not failed, "\n".join(r.describe() for r in failed)
