"""Cross-stream race detection against a real daemon: each planted race beside the correct
version of the same program, which must report nothing.

Races are found by happens-before (server/observation/races.py), not by timing: the tests force both
orders of a racy pair with host functions and expect the same report either way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from observe_helpers import found, kernels, next_line, sites

from simnpu.client import observe
from simnpu.proto import codes

N = 1024
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def checked(npu):
    """The test process as a client checked for races and memory errors, its device set, and the
    test kernels (not initcheck: a racy read of memory not yet copied would also be, on some
    runs, an uninitialised read)."""
    observe.enable("memcheck,racecheck")
    with npu.Device(0):
        yield npu, kernels(npu)


def races(final: bool = False) -> list[dict]:
    return found(observe.report(final), "racecheck")


def filled(npu, value: float = 1.0):
    return npu.DeviceBuffer.from_array(np.full(N, value, np.float32))


# ---- pitfall: two streams sharing memory without an event ---------------------------------------
def test_copy_and_kernel_on_two_streams_without_an_event_race(checked):
    npu, k = checked
    copy_stream, compute_stream = npu.Stream(), npu.Stream()
    host = npu.PinnedBuffer(N * 4)
    host.array(np.float32)[:] = np.arange(N)
    x, y = npu.DeviceBuffer(N * 4), npu.DeviceBuffer(N * 4)
    copy_site = next_line()
    x.copy_from_host(host.array(np.float32), stream=copy_stream)
    launch_site = next_line()
    k["double"].launch(1, x, y, N, stream=compute_stream)  # no event: may read x before it landed
    copy_stream.synchronize()
    compute_stream.synchronize()
    [race] = races()
    assert race["severity"] == "warning" and not race["cross_client"]
    assert sites(race) == [copy_site, launch_site] or sites(race) == [launch_site, copy_site]
    assert race["range"] == [x.ptr, x.ptr + N * 4] and race["bytes"] == N * 4
    whats = sorted(task["what"] for task in race["tasks"])
    assert whats[0] == "kernel double" and whats[1].startswith("memcpy H2D")
    assert (
        "write" in race["text"]
        and "read" in race["text"]
        and "aclrtStreamWaitEvent" in race["text"]
    )
    for buffer in (x, y, host):
        buffer.free()


def test_the_same_pipeline_with_an_event_reports_nothing(checked):
    npu, k = checked
    copy_stream, compute_stream = npu.Stream(), npu.Stream()
    host = npu.PinnedBuffer(N * 4)
    host.array(np.float32)[:] = np.arange(N)
    x, y = npu.DeviceBuffer(N * 4), npu.DeviceBuffer(N * 4)
    for _ in range(3):  # buffers reused: the next copy must also wait for the last kernel
        x.copy_from_host(host.array(np.float32), stream=copy_stream)
        copied = copy_stream.record()
        compute_stream.wait_event(copied)
        k["double"].launch(1, x, y, N, stream=compute_stream)
        done = compute_stream.record()
        copy_stream.wait_event(done)
    compute_stream.synchronize()
    np.testing.assert_array_equal(y.to_numpy(np.float32), 2 * np.arange(N, dtype=np.float32))
    for buffer in (x, y, host):
        buffer.free()
    assert observe.report(final=True)["findings"] == []


def test_a_race_is_reported_whichever_order_the_run_took(checked):
    """Host functions force the write first (the data comes out right) or the read first."""
    npu, k = checked
    rt = npu.runtime()
    for write_first in (True, False):
        s1, s2 = npu.Stream(), npu.Stream()
        source = filled(npu, 3.0)
        x, y = filled(npu, 1.0), filled(npu, 0.0)
        gate = threading.Event()
        before = len(races())
        if write_first:  # s2 reads only after s1 has written (the host waits for s1, then opens)
            x.copy_from(source, stream=s1)
            rt.callbacks.launch_host_func(s2.handle, lambda _, gate=gate: gate.wait(30), None)
            k["double"].launch(1, x, y, N, stream=s2)
            s1.synchronize()
            gate.set()
            s2.synchronize()
            expected = 6.0
        else:  # s1 writes only after s2 has read
            rt.callbacks.launch_host_func(s1.handle, lambda _, gate=gate: gate.wait(30), None)
            x.copy_from(source, stream=s1)
            k["double"].launch(1, x, y, N, stream=s2)
            s2.synchronize()
            gate.set()
            s1.synchronize()
            expected = 2.0
        assert y.to_numpy(np.float32)[0] == expected  # the order really was forced
        found_races = races()[before:]
        assert len(found_races) == 1, (write_first, found_races)
        assert found_races[0]["range"] == [x.ptr, x.ptr + N * 4]
        assert {t["what"] for t in found_races[0]["tasks"]} == {"kernel double", "memcpy D2D 4 KiB"}
        for buffer in (source, x, y):
            buffer.free()
        s1.destroy()
        s2.destroy()


def test_two_streams_only_reading_is_not_a_race(checked):
    npu, k = checked
    s1, s2 = npu.Stream(), npu.Stream()
    x = filled(npu)
    y1, y2 = npu.DeviceBuffer(N * 4), npu.DeviceBuffer(N * 4)
    k["double"].launch(1, x, y1, N, stream=s1)  # access="r"
    k["double"].launch(1, x, y2, N, stream=s2)
    k["peek"].launch(1, x, N, stream=s1)  # asks for "rw", writes nothing
    k["peek"].launch(1, x, N, stream=s2)
    s1.synchronize()
    s2.synchronize()
    for buffer in (x, y1, y2):
        buffer.free()
    assert observe.report(final=True)["findings"] == []


def test_rw_kernels_that_really_write_race(checked):
    npu, k = checked
    s1, s2 = npu.Stream(), npu.Stream()
    x = filled(npu)
    k["inc"].launch(1, x, N, stream=s1)
    k["inc"].launch(1, x, N, stream=s2)
    s1.synchronize()
    s2.synchronize()
    [race] = races()
    assert race["text"].startswith("data race (write-write)") and race["count"] == 1
    assert [t["what"] for t in race["tasks"]] == ["kernel inc", "kernel inc"]
    x.free()


# ---- pitfall: reading results without synchronizing ---------------------------------------------
def test_reading_results_without_synchronizing_is_a_race(checked):
    npu, k = checked
    stream = npu.Stream()
    x, y = filled(npu), filled(npu, 0.0)
    launch_site = next_line()
    k["double"].launch(1, x, y, N, stream=stream)
    read_site = next_line()
    y.to_numpy(np.float32)  # a synchronous copy is not ordered with the stream
    stream.synchronize()
    [race] = races()
    assert set(sites(race)) == {launch_site, read_site}
    assert race["range"] == [y.ptr, y.ptr + N * 4]
    x.free()
    y.free()


def test_reading_results_after_synchronizing_reports_nothing(checked):
    npu, k = checked
    stream = npu.Stream()
    x, y = filled(npu), filled(npu, 0.0)
    k["double"].launch(1, x, y, N, stream=stream)
    stream.synchronize()
    assert y.to_numpy(np.float32)[0] == 2.0
    k["double"].launch(1, x, y, N, stream=stream)
    stream.record().synchronize()  # an event synchronize orders too
    y.to_numpy(np.float32)
    x.free()
    y.free()
    assert observe.report(final=True)["findings"] == []


def test_strict_mode_fails_the_later_task_with_507053(npu):
    observe.enable("racecheck,strict")
    with npu.Device(0):
        k = kernels(npu)
        s1, s2 = npu.Stream(), npu.Stream()
        x = filled(npu)
        k["inc"].launch(1, x, N, stream=s1)
        s2.wait_event(npu.Event())  # (never recorded: does not order anything)
        k["inc"].launch(1, x, N, stream=s2)
        with pytest.raises(npu.NpuError) as failure:
            s1.synchronize()
            s2.synchronize()
        assert failure.value.code == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR == 507053
        assert "data race" in str(failure.value)
        [race] = races()
        assert race["severity"] == "error"
        x.free()


def test_two_clients_sharing_memory_race_unless_one_synchronizes_first(daemon):
    from simnpu.client.runtime import Runtime
    from simnpu.proto import observe as bits

    one, two = Runtime(daemon.address), Runtime(daemon.address)
    try:
        for rt in (one, two):
            rt.observer.enable(bits.CHECKS)
            rt.contexts.set_device(0)
        block = one.memory.malloc(4096)
        one.memory.memset(block, 4096, 0, 4096)
        key = one.memory.ipc_mem_get_export_key(
            block, 4096, codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
        )
        shared = two.memory.ipc_mem_import_by_key(key)
        # unsynchronized: both write; both writes reach the daemon before either host
        # synchronizes (a request answers only after the commands before it reached the
        # scheduler)
        one.memory.memset_async(block, 4096, 1, 4096, 0)
        two.memory.memset_async(shared, 4096, 2, 4096, 0)
        one.memory.get_mem_info(codes.ACL_HBM_MEM)
        two.memory.get_mem_info(codes.ACL_HBM_MEM)
        one.sync.synchronize_stream(0)
        two.sync.synchronize_stream(0)
        reports = [rt.observer.report() for rt in (one, two)]
        for report in reports:  # both clients' reports show it
            [race] = found(report, "racecheck")
            assert race["cross_client"] and race["range"] == [block, block + 4096]
            assert {t["pid"] for t in race["tasks"]} == {os.getpid()}
            assert len({t["client"] for t in race["tasks"]}) == 2
            assert "different clients" in race["text"]
        # synchronized: the first client waits for its write before the second writes
        one.memory.memset_async(block, 4096, 3, 4096, 0)
        one.sync.synchronize_stream(0)
        two.memory.memset_async(shared, 4096, 4, 4096, 0)
        two.sync.synchronize_stream(0)
        assert len(found(two.observer.report(), "racecheck")) == 1  # still only the first one
        two.memory.ipc_mem_close(key)
        one.memory.ipc_mem_close(key)
        one.memory.free(block)
    finally:
        one.close()
        two.close()


# ---- the lessons in examples/, checked -----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "example, clean", [("acl_two_streams.py", True), ("acl_sync_pitfall.py", False)]
)
def test_examples_under_the_checkers(daemon, tmp_path, example, clean):
    report = tmp_path / "report.txt"
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", example)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={
            **os.environ,
            "SIMNPU_ADDRESS": daemon.address,
            "SIMNPU_CHECK": "all",
            "SIMNPU_CHECK_REPORT": str(report),
        },
    )
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    if clean:  # events order every copy and kernel: nothing to report
        assert "0 error(s), 0 warning(s)" in text and "nothing found" in text, text
        assert f"simnpu check: 0 error(s), 0 warning(s); report in {report}" in result.stderr
    else:  # the synchronous memcpy of y while the kernel that writes y is queued
        assert "WARNING racecheck: data race" in text, text
        assert "kernel scale_f32" in text and "acl_sync_pitfall.py:" in text
        assert "simnpu check: 0 error(s), 1 warning(s)" in result.stderr


def test_a_checked_session_that_ends_frees_what_it_owned(daemon):
    """The race checker forgets an ended session's streams; then its memory goes back."""
    from simnpu.client.runtime import Runtime
    from simnpu.proto import observe as bits

    observer = Runtime(daemon.address)
    checked = Runtime(daemon.address)
    try:
        observer.contexts.set_device(0)
        free_before = observer.memory.get_mem_info(codes.ACL_HBM_MEM)[0]
        checked.observer.enable(bits.CHECKS)
        checked.contexts.set_device(0)
        block = checked.memory.malloc(1 << 20)
        streams = [checked.streams.create_stream(), checked.streams.create_stream()]
        for value, stream in enumerate(streams):  # two streams write it: the checker's clocks
            checked.memory.memset_async(block, 1 << 20, value, 1 << 20, stream)
        for stream in streams:
            checked.sync.synchronize_stream(stream)
        assert observer.memory.get_mem_info(codes.ACL_HBM_MEM)[0] < free_before
        checked.close()
        deadline = time.monotonic() + 30
        while observer.memory.get_mem_info(codes.ACL_HBM_MEM)[0] != free_before:
            assert time.monotonic() < deadline, daemon.output()
            time.sleep(0.02)
    finally:
        checked.close()
        observer.close()
    assert "Traceback" not in daemon.output()
