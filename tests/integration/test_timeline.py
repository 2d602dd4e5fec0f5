"""The timeline against a real daemon: a client's trace (SIMNPU_TRACE), the daemon's trace
(simnpu serve --trace), their Chrome/Perfetto layout, and `simnpu trace summary`.

Nothing here asserts a duration: overlap is forced with kernels that complete only if they
run at the same time, and orderings asserted are those the program's events impose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from conftest import run_client
from observe_helpers import kernels

from simnpu.client import observe
from simnpu.client.tools.trace_command import format_summary, summarize

PIPELINE = """
import numpy as np
import simnpu.client as npu
from observe_helpers import kernels
npu.connect()
with npu.Device(0):
    k = kernels(npu)
    copy_stream, compute_stream = npu.Stream(), npu.Stream()
    host = npu.PinnedBuffer(4096)
    host.array(np.float32)[:] = 1
    xs = [npu.DeviceBuffer(4096) for _ in range(3)]
    ys = [npu.DeviceBuffer(4096) for _ in range(3)]
    for x, y in zip(xs, ys):
        x.copy_from_host(host.array(np.float32), stream=copy_stream)
        compute_stream.wait_event(copy_stream.record())
        k["double"].launch(2, x, y, 1024, stream=compute_stream)  # line 16
    compute_stream.synchronize()
    for buffer in xs + ys + [host]:
        buffer.free()
npu.shutdown()
"""


def by_kind(trace: dict) -> dict:
    out: dict = {}
    for event in trace["traceEvents"]:
        out.setdefault(event["ph"], []).append(event)
    return out


def names(trace: dict, what: str) -> dict:
    return {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == what
    }


def test_a_clients_trace_has_stream_tracks_core_tracks_and_event_arrows(daemon, tmp_path):
    path = tmp_path / "trace.json"
    here = os.path.dirname(os.path.abspath(__file__))
    result = run_client(
        daemon.address, PIPELINE, env={"SIMNPU_TRACE": str(path), "PYTHONPATH": here}
    )
    assert result.returncode == 0, result.stderr
    trace = json.loads(path.read_text())
    events = by_kind(trace)
    threads = names(trace, "thread_name")
    processes = names(trace, "process_name")
    client = [pid for (pid, _), name in processes.items() if name.startswith("client ")]
    assert len(client) == 1 and "(session " in processes[(client[0], None)]
    assert any(name == "simnpu device 0" for name in processes.values())
    slices = events["X"]
    kernels_on_streams = [e for e in slices if e["cat"] == "kernel"]
    copies = [e for e in slices if e["cat"] == "copy" and e["name"].startswith("memcpy H2D")]
    waits = [e for e in slices if e["cat"] == "event" and e["name"].startswith("wait event")]
    records = [e for e in slices if e["cat"] == "event" and e["name"].startswith("record event")]
    assert (
        len(kernels_on_streams) == 3 and len(copies) == 3 and len(waits) == 3 and len(records) == 3
    )
    assert {e["args"]["site"] for e in kernels_on_streams} == {"<string>:16"}
    assert all(e["args"]["blocks"] == 2 for e in kernels_on_streams)
    copy_track = {(e["pid"], e["tid"]) for e in copies}
    compute_track = {(e["pid"], e["tid"]) for e in kernels_on_streams}
    assert len(copy_track) == len(compute_track) == 1 and copy_track != compute_track
    assert threads[copy_track.pop()].startswith("stream ") and threads[
        compute_track.pop()
    ].startswith("stream ")
    # an arrow from each record (copy stream) to the wait bound to it (compute stream)
    starts, ends = events["s"], events["f"]
    assert len(starts) == len(ends) == 3
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    record_track = {(e["pid"], e["tid"]) for e in records}
    wait_track = {(e["pid"], e["tid"]) for e in waits}
    assert {(e["pid"], e["tid"]) for e in starts} == record_track
    assert {(e["pid"], e["tid"]) for e in ends} == wait_track
    # each kernel waited for its chunk's copy (the event orders them on the device clock)
    copies.sort(key=lambda e: e["args"]["task"])
    kernels_on_streams.sort(key=lambda e: e["args"]["task"])
    for copy, kernel in zip(copies, kernels_on_streams):
        assert kernel["ts"] >= copy["ts"] + copy["dur"] - 0.001
    # the work on the device tracks: two blocks per kernel, spread over the AI cores
    cores = [e for e in slices if e["cat"] == "core"]
    pieces = [e for e in cores if e["name"].startswith("double [block")]
    assert sum(2 if "blocks" in e["name"] else 1 for e in pieces) == 6
    assert all(threads[(e["pid"], e["tid"])].startswith(("AI core", "copy engine")) for e in cores)
    assert trace["otherData"]["tasks"] == len(slices) - len(cores)


def test_overlap_of_two_streams_shows_in_the_summary(npu, tmp_path):
    """Two kernels that each wait for the other complete only if they ran at the same time."""
    observe.enable(trace=True)
    with npu.Device(0):
        k = kernels(npu)
        flags = npu.DeviceBuffer.from_array(np.zeros(8, np.int32))
        one, two = npu.Stream(), npu.Stream()
        k["rendezvous"].launch(1, flags, 0, 1, 20.0, stream=one)
        k["rendezvous"].launch(1, flags, 1, 0, 20.0, stream=two)
        one.synchronize()
        two.synchronize()
        path = tmp_path / "overlap.json"
        observe.save_trace(str(path))
        flags.free()
    summary = summarize(json.loads(path.read_text()))
    busy = [s for s in summary["streams"] if s["kinds"].get("kernel")]
    assert len(busy) == 2
    assert summary["overlap_us"] > 0 and summary["parallelism"] > 1.0
    result = subprocess.run(
        [sys.executable, "-m", "simnpu", "trace", "summary", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "2+ streams busy at once" in result.stdout and "overlap achieved" in result.stdout
    assert result.stdout.count("1 kernel") == 2


def test_summary_numbers_of_a_known_trace():
    def x(name, cat, ts, dur, tid, **args):
        return {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": ts,
            "dur": dur,
            "pid": 7,
            "tid": tid,
            "args": {"task": args.get("task", 0), **args},
        }

    trace = {
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "client 7 app"}},
            {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "stream 1"}},
            {"ph": "M", "name": "thread_name", "pid": 7, "tid": 2, "args": {"name": "stream 2"}},
            x("k1", "kernel", 0, 10, 1, task=1, site="app.py:3"),
            x("wait event (record task 4)", "event", 10, 20, 1, task=2),
            x("k2", "kernel", 30, 10, 1, task=3, site="app.py:5"),
            x("memcpy H2D 1 KiB", "copy", 5, 20, 2, task=4),
            x("record event 1", "event", 25, 0.001, 2, task=5),
            x("k1 [block 0]", "core", 0, 10, 9),
        ],
        "otherData": {"generator": "test"},
    }
    summary = summarize(trace)
    streams = {s["stream"]: s for s in summary["streams"]}
    assert streams["client 7 app / stream 1"]["busy_us"] == 20
    assert streams["client 7 app / stream 2"]["busy_us"] == 20
    assert summary["busy_any_us"] == 35 and summary["overlap_us"] == 5 and summary["span_us"] == 40
    assert abs(summary["parallelism"] - 40 / 35) < 1e-9
    [gap] = summary["longest_gaps"][:1]
    assert gap["gap_us"] == 20 and gap["stream"] == "client 7 app / stream 1"
    assert gap["after"] == "k1 (task 1, app.py:3)" and gap["before"] == "k2 (task 3, app.py:5)"
    assert gap["waiting"] == ["wait event (record task 4) (task 2)"]
    text = format_summary(summary, "known.json")
    assert "0.020 ms  client 7 app / stream 1: after k1 (task 1, app.py:3)" in text


def test_a_daemon_tracing_everyone_writes_its_trace_at_exit_and_on_demand(start_daemon, tmp_path):
    path = tmp_path / "daemon-trace.json"
    process = start_daemon("--trace", str(path))
    here = os.path.dirname(os.path.abspath(__file__))
    result = run_client(process.address, PIPELINE, env={"PYTHONPATH": here})
    assert result.returncode == 0, result.stderr
    saved = tmp_path / "saved.json"
    simnpu = [sys.executable, "-m", "simnpu"]
    save = subprocess.run(
        simnpu + ["trace", "save", str(saved), "--address", process.address],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert save.returncode == 0, save.stderr
    smi = subprocess.run(
        simnpu + ["smi", "--address", process.address],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "observing: trace" in smi.stdout
    process.stop()
    for document in (json.loads(saved.read_text()), json.loads(path.read_text())):
        slices = [e for e in document["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"]
        assert len(slices) == 3 and document["otherData"]["generator"] == "simnpu daemon"
        assert len([e for e in document["traceEvents"] if e["ph"] == "s"]) == 3
