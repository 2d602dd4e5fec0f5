"""Graph replays on the timeline against a real daemon: the replay as a slice on its stream,
its tasks on its model's tracks with the call sites where they were captured (traced and
checked clients), and `simnpu trace summary`'s per-replay times. No duration is asserted:
only containment and order, which the replay imposes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import run_client

from simnpu.client.tools.trace_command import format_summary, summarize

REPLAYS = 3
GRAPH = """
import numpy as np
import simnpu.client as npu
npu.connect()
with npu.Device(0):
    x = npu.DeviceBuffer.from_array(np.arange(1024, dtype=np.float32))
    y, z = npu.DeviceBuffer(4096), npu.DeviceBuffer(4096)
    add, relu = npu.builtin("add_f32"), npu.builtin("relu_f32")
    s0, s1 = npu.Stream(), npu.Stream()
    g = npu.Graph()
    with npu.graph(g, stream=s0):
        fork = s0.record()
        s1.wait_event(fork)
        relu.launch(2, x, z, 1024, stream=s1)  # line 14
        add.launch(1, x, x, y, 1024)  # line 15
        s0.wait_event(s1.record())
    for _ in range(3):
        g.replay(s0)
    s0.synchronize()
    assert np.array_equal(y.to_numpy(np.float32), 2 * np.arange(1024))
    print(g.id)
    g.destroy()
    for thing in (fork, s0, s1, x, y, z):
        thing.destroy() if hasattr(thing, "destroy") else thing.free()
npu.shutdown()
"""


def traced_run(daemon, tmp_path, env: dict) -> tuple[dict, int]:
    path = tmp_path / "replays.json"
    result = run_client(daemon.address, GRAPH, env={"SIMNPU_TRACE": str(path), **env})
    assert result.returncode == 0, result.stderr
    return json.loads(path.read_text()), int(result.stdout.split()[-1])


def track_names(trace: dict) -> dict:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


@pytest.mark.parametrize("check", ["", "memcheck"], ids=["traced", "checked"])
def test_a_replays_tasks_are_on_its_models_tracks_inside_the_replay(daemon, tmp_path, check):
    trace, model = traced_run(daemon, tmp_path, {"SIMNPU_CHECK": check} if check else {})
    tracks = track_names(trace)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "core"]
    replays = sorted((e for e in slices if e["cat"] == "replay"), key=lambda e: e["ts"])
    assert [e["name"] for e in replays] == [f"replay of model {model}"] * REPLAYS
    assert all(e["args"]["tasks"] == 6 for e in replays)
    assert len({(e["pid"], e["tid"]) for e in replays}) == 1  # on the replaying stream
    kernels = [e for e in slices if e["cat"] == "kernel"]
    assert len(kernels) == 2 * REPLAYS  # none ran at capture
    by_track: dict = {}
    for kernel in kernels:
        by_track.setdefault(tracks[(kernel["pid"], kernel["tid"])], []).append(kernel)
    assert sorted(by_track) == [
        f"model {model} stream 0 (replays) device 0",
        f"model {model} stream 1 (replays) device 0",
    ]
    sites = {name: {e["args"]["site"] for e in events} for name, events in by_track.items()}
    assert sites == {
        f"model {model} stream 0 (replays) device 0": {"<string>:15"},
        f"model {model} stream 1 (replays) device 0": {"<string>:14"},
    }
    for events in by_track.values():  # the n-th replay holds the n-th run of each task
        events.sort(key=lambda e: e["ts"])
        for replay, kernel in zip(replays, events):
            assert replay["ts"] - 0.001 <= kernel["ts"]
            assert kernel["ts"] + kernel["dur"] <= replay["ts"] + replay["dur"] + 0.001


def test_the_summary_lists_per_replay_times(daemon, tmp_path):
    trace, model = traced_run(daemon, tmp_path, {})
    summary = summarize(trace)
    [row] = summary["replays"]
    assert (row["model"], row["replays"], row["tasks"]) == (f"replay of model {model}", 3, 6)
    assert 0 < row["min_us"] <= row["mean_us"] <= row["max_us"]
    assert row["total_us"] == pytest.approx(row["mean_us"] * REPLAYS)
    text = format_summary(summary, "replays.json")
    assert "replays (from its stream reaching a replay" in text
    path = tmp_path / "replays.json"
    result = subprocess.run(
        [sys.executable, "-m", "simnpu", "trace", "summary", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [line] = [x for x in result.stdout.splitlines() if x.strip().startswith("replay of model")]
    assert line.split()[4:6] == ["3", "6"]
    assert "3 replay" in result.stdout  # the replaying stream's kinds


USE_AFTER_FREE = """
import numpy as np
import simnpu.client as npu
npu.connect()
with npu.Device(0):
    x = npu.DeviceBuffer.from_array(np.arange(1024, dtype=np.float32))
    y = npu.DeviceBuffer(4096)
    s = npu.Stream()
    g = npu.Graph()
    with npu.graph(g, stream=s):
        npu.builtin("relu_f32").launch(1, x, y, 1024)  # line 11
    x.free()
    g.replay(s)
    try:
        s.synchronize()
    except npu.NpuError as error:
        print(error.code)
        print(error.message)
    g.destroy()
    y.free()
    s.destroy()
npu.shutdown()
"""


def test_a_replay_using_a_freed_buffer_is_caught_with_its_capture_site(daemon, tmp_path):
    report = tmp_path / "check.txt"
    result = run_client(
        daemon.address,
        USE_AFTER_FREE,
        env={"SIMNPU_CHECK": "memcheck", "SIMNPU_CHECK_REPORT": str(report)},
    )
    assert result.returncode == 0, result.stderr
    code, *message = result.stdout.splitlines()
    assert int(code) == 507053
    assert message[0] == "simnpu memcheck: use-after-free"
    assert "by kernel relu_f32" in message[2] and "submitted at <string>:11" in message[2]
    assert "use-after-free" in report.read_text()


def test_buffers_a_synchronized_replay_used_are_freed_without_a_finding(daemon, tmp_path):
    """The replaying stream goes on only once the replay's streams drained: a host that
    synchronized it has seen their tasks finish, so freeing what they used is no error."""
    report = tmp_path / "check.txt"
    env = {"SIMNPU_CHECK": "memcheck", "SIMNPU_CHECK_REPORT": str(report)}
    result = run_client(daemon.address, GRAPH, env=env)
    assert result.returncode == 0, result.stderr
    assert "0 error(s), 0 warning(s)" in report.read_text()
