"""`simnpu smi` against a real daemon: the npu-smi style table, --json, --watch, and no daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
from observe_helpers import kernels


def smi(address: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simnpu", "smi", "--address", address, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_smi_shows_the_device_and_this_process_with_its_memory_and_streams(npu, daemon):
    with npu.Device(0):
        streams = [npu.Stream(), npu.Stream()]
        block = npu.DeviceBuffer(3 << 20)  # huge-first: 4 MiB reserved
        result = smi(daemon.address)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[1].startswith("| simnpu-smi ") and f"Daemon: pid {daemon.pid}" in lines[1]
        device_row = next(line for line in lines if line.startswith("| 0       simnpu"))
        assert "| OK " in device_row and "/ 256" in device_row
        mine = [line for line in lines if f"| {os.getpid()} " in line]
        assert len(mine) == 1
        cells = mine[0].split("|")[3].split()
        assert cells[-3:] == ["4", "3", "0"]  # memory (MB), streams (default + 2), graphs
        view = json.loads(smi(daemon.address, "--json").stdout)
        [me] = [p for p in view["processes"] if p["pid"] == os.getpid()]
        assert me["devices"]["0"] == {"memory": 4 << 20, "streams": 3, "graphs": 0}
        assert (
            view["devices"][0]["memory_used"] >= 4 << 20 and view["observe"] is None
        )  # off by default
        block.free()
        for stream in streams:
            stream.destroy()


def test_smi_counts_the_live_graphs_of_a_process(npu, daemon):
    with npu.Device(0):
        stream = npu.Stream()
        graphs = [npu.Graph(), npu.Graph()]
        for g in graphs:
            with npu.graph(g, stream=stream):
                stream.record().destroy()
        result = smi(daemon.address)
        [mine] = [line for line in result.stdout.splitlines() if f"| {os.getpid()} " in line]
        assert mine.split("|")[3].split()[-1] == "2"
        assert "Streams  Graphs" in result.stdout
        graphs[0].destroy()
        view = json.loads(smi(daemon.address, "--json").stdout)
        [me] = [p for p in view["processes"] if p["pid"] == os.getpid()]
        assert me["graphs"] == 1 and me["devices"]["0"]["graphs"] == 1
        graphs[1].destroy()
        stream.destroy()


def test_ai_core_use_counts_a_core_held_by_a_running_kernel(npu, daemon):
    with npu.Device(0):
        flags = npu.DeviceBuffer.from_array(np.zeros(8, np.int32))
        stream = npu.Stream()
        kernels(npu)["rendezvous"].launch(
            1, flags, 0, 1, 30.0, stream=stream
        )  # holds a core until flag 1
        deadline = time.monotonic() + 30
        while flags.to_numpy(np.int32)[0] == 0:  # until it has started
            assert time.monotonic() < deadline, "the kernel never started"
        view = json.loads(smi(daemon.address, "--json").stdout)
        flags.copy_from_host(np.array([1, 1], np.int32))  # let it finish
        stream.synchronize()
        flags.free()
    device = view["devices"][0]
    assert device["ai_cores_running"] == 1 and device["ai_core_percent"] >= 50.0


def test_watch_refreshes_like_watch(daemon):
    result = smi(daemon.address, "--watch", "0.1", "--count", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Every 0.1s: simnpu smi") == 2
    assert result.stdout.count("| simnpu-smi ") == 2


def test_no_processes_and_no_daemon(start_daemon, tmp_path):
    fresh = start_daemon()
    result = smi(fresh.address)
    assert "No running processes found in NPU 0" in result.stdout
    missing = f"unix://{tmp_path}/none.sock"
    result = smi(missing)
    assert result.returncode == 1 and "no simnpu daemon at" in result.stderr
    assert not os.path.exists(tmp_path / "none.sock")  # and none was started
