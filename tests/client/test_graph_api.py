"""simnpu.client.Graph and graph() against a real daemon: capture and replay, fork/join, the
task table of repr(), what a refused call inside the block does, failures, destroy."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from simnpu.proto import codes

N = 1024
FAILS = """
from simnpu import kernel

@kernel("ptr")
def fails(ctx, x):
    raise ValueError("this kernel always fails")
"""


@pytest.fixture
def dev(npu):
    """Device 0 current, with buffers x = 0..N-1, y = 1, z = 0 (freed after)."""
    with npu.Device(0):
        x = npu.DeviceBuffer.from_array(np.arange(N, dtype=np.float32))
        y = npu.DeviceBuffer.from_array(np.ones(N, np.float32))
        z = npu.DeviceBuffer.from_array(np.zeros(N, np.float32))
        yield x, y, z
        for buffer in (x, y, z):
            buffer.free()


def test_a_captured_kernel_runs_only_when_replayed_and_on_the_current_data(npu, dev):
    x, y, z = dev
    add = npu.builtin("add_f32")
    stream = npu.Stream()
    g = npu.Graph()
    with npu.graph(g, stream=stream) as captured:
        assert captured is g
        assert npu.current_stream() is stream
        add.launch(2, x, y, z, N)  # on the current stream: the one captured
    assert npu.current_stream() is not stream
    stream.synchronize()
    assert not z.to_numpy(np.float32).any()  # recorded, not run
    g.replay(stream)
    stream.synchronize()
    assert np.array_equal(z.to_numpy(np.float32), np.arange(N) + 1)
    y.copy_from_host(np.full(N, 10, np.float32))  # the graph keeps the addresses
    g.replay(stream)
    g.replay(stream)
    stream.synchronize()
    assert np.array_equal(z.to_numpy(np.float32), np.arange(N) + 10)
    g.execute()
    g.destroy()
    g.destroy()  # idempotent
    assert g.handle == 0
    stream.destroy()


def test_without_a_stream_the_capture_has_its_own_and_replay_uses_the_current(npu, dev):
    x, y, z = dev
    g = npu.Graph()
    with npu.graph(g, mode="relaxed"):
        inside = npu.current_stream()
        assert inside.handle != 0
        npu.builtin("relu_f32").launch(1, y, z, N)
    stream = npu.Stream()
    with stream:
        g.replay()
    stream.synchronize()
    assert np.array_equal(z.to_numpy(np.float32), np.ones(N))
    g.destroy()
    stream.destroy()


def test_a_fork_join_graph_lists_its_tasks_and_dependencies(npu, dev):
    x, y, z = dev
    add, relu = npu.builtin("add_f32"), npu.builtin("relu_f32")
    s0, s1 = npu.Stream(), npu.Stream()
    g = npu.Graph()
    with npu.graph(g, stream=s0):
        fork = s0.record()
        s1.wait_event(fork)  # pulls s1 into the capture
        relu.launch(1, x, z, N, stream=s1)
        add.launch(1, x, y, y, N, stream=s0)
        s0.wait_event(s1.record())  # joins it back
    g.name = "fork-join"
    assert g.name == "fork-join"
    tasks = g.tasks()
    assert [(t["stream"], t["seq_id"], t["kind"]) for t in tasks] == [
        (0, 0, "record"),
        (0, 1, "kernel"),
        (0, 2, "wait"),
        (1, 0, "wait"),
        (1, 1, "kernel"),
        (1, 2, "record"),
    ]
    waits = {(t["stream"], t["seq_id"]): t["after"] for t in tasks if t["kind"] == "wait"}
    assert waits == {(0, 2): [1, 2], (1, 0): [0, 0]}
    table = repr(g)
    lines = table.splitlines()
    assert lines[0] == f"<simnpu Graph model {g.id}: 6 task(s) on 2 stream(s)"
    assert lines[1].split() == ["task", "stream", "kind", "after", "group", "name"]
    assert lines[4].split()[:4] == ["0.2", "0", "wait", "0.1,1.2"]
    assert lines[5].split()[:4] == ["1.0", "1", "wait", "0.0"]
    assert "relu_f32" in lines[6] and lines[6].split()[3] == "1.0"
    g.replay(s0)
    s0.synchronize()
    assert np.array_equal(z.to_numpy(np.float32), np.arange(N))
    assert np.array_equal(y.to_numpy(np.float32), np.arange(N) + 1)
    for thing in (fork, g, s0, s1):
        thing.destroy()


def test_an_uncaptured_graph_and_bad_arguments(npu, dev):
    g = npu.Graph()
    assert repr(g) == "<simnpu Graph (not captured)>"
    with pytest.raises(npu.NpuError) as error:
        g.replay()
    assert error.value.code == codes.ACL_ERROR_INVALID_PARAM
    with pytest.raises(npu.NpuError) as error:
        g.execute()
    assert error.value.code == codes.ACL_ERROR_INVALID_PARAM
    with pytest.raises(ValueError, match="mode 'bogus'"):
        with npu.graph(g, mode="bogus"):
            pass
    g.destroy()  # nothing to release


def test_a_refused_call_in_the_block_ends_the_capture_and_drops_its_graph(npu, dev):
    x, y, z = dev
    stream = npu.Stream()
    g = npu.Graph()
    with pytest.raises(npu.NpuError) as error:
        with npu.graph(g, stream=stream):
            npu.builtin("relu_f32").launch(1, x, z, N)
            stream.synchronize()  # refused in every mode
    assert error.value.code == codes.ACL_ERROR_RT_STREAM_CAPTURED
    assert g.handle == 0
    npu.builtin("relu_f32").launch(1, y, z, N, stream=stream)  # the stream runs again
    stream.synchronize()
    assert np.array_equal(z.to_numpy(np.float32), np.ones(N))
    stream.destroy()


def test_an_invalidated_capture_raises_at_the_end_of_the_block(npu, dev):
    x, y, z = dev
    stream = npu.Stream()
    inner, g = npu.Graph(), npu.Graph()
    with npu.graph(inner, stream=stream):
        pass
    with pytest.raises(npu.NpuError) as error:
        with npu.graph(g, stream=stream, mode="global"):
            with pytest.raises(npu.NpuError) as refused:
                z.copy_from_host(np.zeros(N, np.float32))  # aclrtMemcpy: refused in GLOBAL
            assert refused.value.code == codes.ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT
            inner.replay()  # a replay cannot be captured: the capture is invalidated
    assert error.value.code == codes.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED
    assert g.handle == 0
    inner.destroy()
    with npu.graph(g, stream=stream, mode="relaxed"):  # a new capture makes a new graph
        z.copy_from_host(np.zeros(N, np.float32))  # allowed in RELAXED
        npu.builtin("relu_f32").launch(1, x, z, N)
    g.replay(stream)
    stream.synchronize()
    assert np.array_equal(z.to_numpy(np.float32), np.arange(N))
    g.destroy()
    stream.destroy()


def test_a_failing_task_of_a_replay_is_raised_with_its_capture_site(npu, dev):
    x, _, _ = dev
    module = npu.Module.from_source(FAILS)
    stream = npu.Stream()
    g = npu.Graph()
    with npu.graph(g, stream=stream):
        line = sys._getframe().f_lineno + 1
        module.function("fails").launch(1, x)
    g.replay(stream)
    with pytest.raises(npu.NpuError) as error:
        stream.synchronize()
    assert error.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "this kernel always fails" in error.value.message
    assert f"test_graph_api.py:{line}" in error.value.message
    stream.synchronize()  # reported once
    g.destroy()
    stream.destroy()
    module.unload()


def test_a_graph_is_captured_once(npu, dev):
    """A second capture into a captured graph is refused (aclmdlRICaptureToModelRIBegin takes
    only a model never captured: 107026) and leaves the graph as it was."""
    x, y, z = dev
    add = npu.builtin("add_f32")
    stream = npu.Stream()
    g = npu.Graph()
    with npu.graph(g, stream=stream):
        add.launch(1, x, y, z, N)
    with pytest.raises(npu.NpuError) as error:
        with npu.graph(g, stream=stream):
            add.launch(1, x, x, z, N)
    assert error.value.code == 107026
    assert [task["kind"] for task in g.tasks()] == ["kernel"]
    g.replay(stream)
    stream.synchronize()
    assert np.array_equal(z.to_numpy(np.float32), np.arange(N) + 1)
    g.destroy()
    stream.destroy()
