"""Task groups, their updates and disabled tasks of simnpu.client.Graph against a real
daemon: a group between other tasks updated with other buffers, scalars and kernels (bit for
bit), an update racing a queued replay held by an ACL_EVENT_EXTERNAL event, the group column of
repr(), every refusal with its code, and that nothing is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import round_trip, runtime_of

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

N = 512


@pytest.fixture
def dev(npu):
    """Device 0 current; `make(values)` makes a buffer of N floats, freed after the test."""
    made = []

    def make(values=None):
        array = np.zeros(N, np.float32) if values is None else np.asarray(values, np.float32)
        made.append(npu.DeviceBuffer.from_array(array))
        return made[-1]

    with npu.Device(0):
        yield make
        for buffer in made:
            buffer.free()


def _code(error: pytest.ExceptionInfo) -> int:
    return error.value.code


def _graphs_of_this_process(address: str) -> int:
    """The live graphs `simnpu smi --json` counts for this process."""
    result = subprocess.run(
        [sys.executable, "-m", "simnpu", "smi", "--address", address, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [me] = [p for p in json.loads(result.stdout)["processes"] if p["pid"] == os.getpid()]
    return me["graphs"]


def test_a_group_between_other_tasks_is_updated_bit_for_bit(npu, dev):
    rng = np.random.default_rng(5)
    x, y, w, v = (rng.standard_normal(N).astype(np.float32) for _ in range(4))
    px, py, pw, pv = dev(x), dev(y), dev(w), dev(v)
    a, b, c, out = dev(), dev(), dev(), dev()
    add, mul, fill, relu = (
        npu.builtin(name) for name in ("add_f32", "mul_f32", "fill_f32", "relu_f32")
    )
    stream, updater = npu.Stream(), npu.Stream()
    g = npu.Graph()
    with npu.graph(g, stream=stream):
        relu.launch(1, px, a, N)
        with g.task_group() as group:
            assert npu.current_stream() is stream
            add.launch(2, px, py, b, N)
            fill.launch(1, c, 3.0, N)
        mul.launch(1, b, c, out, N)
    assert group.handle and group.graph is g
    assert repr(group) == f"<simnpu TaskGroup {group.handle:#x}>"
    tasks = g.tasks()
    assert [(t["kind"], t["group"]) for t in tasks] == [
        ("kernel", 0),
        ("kernel", group.handle),
        ("kernel", group.handle),
        ("kernel", 0),
    ]
    lines = repr(g).splitlines()
    assert lines[1].split() == ["task", "stream", "kind", "after", "group", "name"]
    assert [line.split()[4] for line in lines[2:]] == ["-", "g1", "g1", "-"]
    assert "fill_f32" in lines[4]

    def replay() -> dict[str, np.ndarray]:
        for buffer in (a, b, c, out):
            buffer.copy_from_host(np.zeros(N, np.float32))
        g.replay(stream)
        stream.synchronize()
        return {name: buf.to_numpy(np.float32) for name, buf in zip("abco", (a, b, c, out))}

    three = np.full(N, 3.0, np.float32)
    first = replay()
    assert np.array_equal(first["a"], np.maximum(x, 0))
    assert np.array_equal(first["b"], x + y)
    assert np.array_equal(first["c"], three)
    assert np.array_equal(first["o"], (x + y) * three)
    # other buffers and another scalar: later replays run the new kernels
    with g.update(group, stream=updater) as updated:
        assert updated is group and npu.current_stream() is updater
        add.launch(1, pw, pv, b, N)
        fill.launch(2, c, -2.5, N)
    updater.synchronize()
    scale = np.full(N, -2.5, np.float32)
    for _ in range(2):
        second = replay()
        assert np.array_equal(second["a"], np.maximum(x, 0))  # outside the group: as captured
        assert np.array_equal(second["b"], w + v)
        assert np.array_equal(second["c"], scale)
        assert np.array_equal(second["o"], (w + v) * scale)
    # another kernel in the first one's place
    with g.update(group, stream=updater):
        mul.launch(1, px, pw, b, N)
        fill.launch(1, c, 0.5, N)
    updater.synchronize()
    third = replay()
    half = np.full(N, 0.5, np.float32)
    assert np.array_equal(third["b"], x * w)
    assert np.array_equal(third["o"], (x * w) * half)
    assert np.array_equal(third["a"], np.maximum(x, 0))
    listed = g.tasks()
    assert listed[1]["name"] == "mul_f32"
    g.destroy()
    rt = npu.runtime()  # the client forgets the tasks it listed with their graph
    for handle in {t["handle"] for t in listed}:
        assert rt.graphs.task_model(handle) == 0
        with pytest.raises(NpuError) as forgotten:
            rt.graphs.model_task_get_type(handle)
        assert forgotten.value.code == codes.ACL_ERROR_RT_INVALID_HANDLE
    for s in (stream, updater):
        s.destroy()


def test_an_update_races_a_replay_held_by_an_external_event(npu, dev):
    """The runtime's pattern: the replay, queued first, waits inside the graph for an
    ACL_EVENT_EXTERNAL event that the update stream records after its update."""
    rng = np.random.default_rng(9)
    x, y, w = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    px, py, pw, out = dev(x), dev(y), dev(w), dev()
    add, mul = npu.builtin("add_f32"), npu.builtin("mul_f32")
    stream, updater = npu.Stream(), npu.Stream()
    event = npu.Event(codes.ACL_EVENT_EXTERNAL)
    g = npu.Graph()
    with npu.graph(g, stream=stream, mode="relaxed"):
        stream.wait_event(event)
        event.reset(stream)
        with g.task_group() as group:
            add.launch(1, px, py, out, N)

    def replay(kernel, second) -> np.ndarray:
        g.replay(stream)  # held by the event
        if kernel is not None:
            with g.update(group, stream=updater):
                kernel.launch(1, px, second, out, N)
        event.record(updater)
        updater.synchronize()
        stream.synchronize()
        return out.to_numpy(np.float32)

    assert np.array_equal(replay(None, None), x + y)
    assert np.array_equal(replay(add, pw), x + w)  # the replay queued before the update
    assert np.array_equal(replay(None, None), x + w)  # and the later ones
    assert np.array_equal(replay(mul, py), x * y)
    g.destroy()
    event.destroy()
    for s in (stream, updater):
        s.destroy()


def test_task_group_refusals(npu, dev):
    x, out = dev(np.ones(N)), dev()
    add = npu.builtin("add_f32")
    stream, forked = npu.Stream(), npu.Stream()
    g = npu.Graph()
    with pytest.raises(npu.NpuError) as error:  # not in capture
        with g.task_group(stream=stream):
            pass
    assert _code(error) == codes.ACL_ERROR_RT_STREAM_NOT_CAPTURED
    with pytest.raises(npu.NpuError) as error:  # one open already: the graph goes too
        with npu.graph(g, stream=stream):
            with g.task_group():
                with g.task_group():
                    pass
    assert _code(error) == codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS
    assert g.handle == 0
    with pytest.raises(npu.NpuError) as error:  # a task that is not a kernel
        with npu.graph(g, stream=stream):
            with g.task_group() as group:
                add.launch(1, x, x, out, N)
                out.fill(0, stream=stream)
    assert _code(error) == codes.ACL_ERROR_RT_TASK_TYPE_NOT_SUPPORT
    assert group.handle == 0 and g.handle == 0
    with pytest.raises(npu.NpuError) as error:  # another stream of the capture meanwhile
        with npu.graph(g, stream=stream):
            forked.wait_event(stream.record())
            with g.task_group():
                add.launch(1, x, x, out, N, stream=forked)
    assert _code(error) == codes.ACL_ERROR_STREAM_TASK_GROUP_INTR
    assert g.handle == 0
    inner = npu.Graph()
    with npu.graph(inner, stream=forked):
        add.launch(1, x, x, out, N)
    with pytest.raises(npu.NpuError) as error:  # the capture invalidated inside the group
        with npu.graph(g, stream=stream):
            with g.task_group():
                inner.replay()  # a replay cannot be captured
    assert _code(error) == codes.ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED
    assert g.handle == 0
    with npu.graph(g, stream=stream):
        with g.task_group() as group:
            add.launch(1, x, x, out, N)
    h = npu.Graph()
    with pytest.raises(npu.NpuError) as error:  # a stream updating a group opens none
        with g.update(group, stream=forked):
            with npu.graph(h, stream=forked):
                with h.task_group():
                    pass
    assert _code(error) == codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS
    assert h.handle == 0
    for made in (g, inner):
        made.destroy()
    # a group on a forked stream, given as `stream`; the block's own error ends the group
    with npu.graph(g, stream=stream):
        fork = stream.record()
        forked.wait_event(fork)
        with g.task_group(stream=forked) as group:
            assert npu.current_stream() is forked
            add.launch(1, x, x, out, N)
        with pytest.raises(RuntimeError, match="in the block"):
            with g.task_group() as broken:
                raise RuntimeError("in the block")
        assert broken.handle == 0
        join = forked.record()
        stream.wait_event(join)
    assert [(t["stream"], t["group"]) for t in g.tasks() if t["kind"] == "kernel"] == [
        (1, group.handle)
    ]
    g.replay(stream)
    stream.synchronize()
    assert np.array_equal(out.to_numpy(np.float32), np.full(N, 2.0, np.float32))
    g.destroy()
    for thing in (fork, join, stream, forked):
        thing.destroy()


def test_update_refusals(npu, dev, daemon):
    x, out = dev(np.ones(N)), dev()
    add, mul = npu.builtin("add_f32"), npu.builtin("mul_f32")
    stream, updater, other = npu.Stream(), npu.Stream(), npu.Stream()
    g, h = npu.Graph(), npu.Graph()
    with npu.graph(g, stream=stream):
        with g.task_group() as group:
            add.launch(1, x, x, out, N)
            add.launch(2, out, x, out, N)
    with npu.graph(h, stream=stream):
        with h.task_group() as foreign:
            add.launch(1, x, x, out, N)
    with pytest.raises(npu.NpuError) as error:  # a group of another graph
        with g.update(foreign, stream=updater):
            pass
    assert _code(error) == codes.ACL_ERROR_INVALID_PARAM
    with pytest.raises(npu.NpuError) as error:  # a group never made
        with g.update(npu.TaskGroup(g), stream=updater):
            pass
    assert _code(error) == codes.ACL_ERROR_INVALID_PARAM
    with pytest.raises(npu.NpuError) as error:  # a stream in capture
        with npu.graph(npu.Graph(), stream=other):
            with g.update(group):
                pass
    assert _code(error) == codes.ACL_ERROR_RT_STREAM_CAPTURED
    with pytest.raises(npu.NpuError) as error:  # the group updated by another stream
        with g.update(group, stream=updater):
            with g.update(group, stream=other):
                pass
    assert _code(error) == codes.ACL_ERROR_STREAM_TASK_GROUP_STATUS
    with pytest.raises(npu.NpuError) as error:  # fewer launches than the group has
        with g.update(group, stream=updater):
            mul.launch(1, x, x, out, N)
    assert _code(error) == codes.ACL_ERROR_RT_INTERNAL_ERROR
    with g.update(group, stream=updater):  # one too many: that launch fails, the rest holds
        for _ in range(3):
            mul.launch(1, x, x, out, N)
    with pytest.raises(npu.NpuError) as error:
        updater.synchronize()
    assert _code(error) == codes.ACL_ERROR_RT_INTERNAL_ERROR
    assert "one more than it can update" in error.value.message
    updater.synchronize()
    with pytest.raises(RuntimeError, match="in the block"):  # the update ends all the same
        with g.update(group, stream=updater):
            raise RuntimeError("in the block")
    out.copy_from_host(np.full(N, 5.0, np.float32))
    g.replay(stream)  # out = 1 * 1, twice
    stream.synchronize()
    assert np.array_equal(out.to_numpy(np.float32), np.ones(N, np.float32))
    g.destroy()
    with pytest.raises(npu.NpuError) as error:  # the group went with its graph
        with g.update(group, stream=updater):
            pass
    assert _code(error) == codes.ACL_ERROR_RT_INVALID_HANDLE
    h.destroy()
    for s in (stream, updater, other):
        s.destroy()
    assert _graphs_of_this_process(daemon.address) == 0
    with runtime_of(daemon.address) as rt:  # another client is served as before
        round_trip(rt)


def test_a_disabled_task_no_longer_runs_in_replays(npu, dev):
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    px, py, a, b = dev(x), dev(y), dev(), dev()
    stream, updater = npu.Stream(), npu.Stream()
    g = npu.Graph()
    with npu.graph(g, stream=stream):
        npu.builtin("relu_f32").launch(1, px, a, N)
        npu.builtin("add_f32").launch(1, px, py, b, N)
    relu, add = g.tasks()
    g.disable(add)
    g.replay(stream)
    stream.synchronize()
    assert np.array_equal(a.to_numpy(np.float32), np.maximum(x, 0))
    assert not b.to_numpy(np.float32).any()
    g.disable(relu["handle"])  # or its handle
    a.copy_from_host(np.zeros(N, np.float32))
    g.execute()
    assert not a.to_numpy(np.float32).any() and not b.to_numpy(np.float32).any()
    # a task of another graph, none, one of a queued replay's graph
    other = npu.Graph()
    with npu.graph(other, stream=stream):
        a.fill(0, stream=stream)
    [memset] = other.tasks()
    for task in (memset, 0):
        with pytest.raises(npu.NpuError) as error:
            g.disable(task)
        assert _code(error) == codes.ACL_ERROR_INVALID_PARAM
    event = npu.Event(codes.ACL_EVENT_EXTERNAL)
    stream.wait_event(event)  # holds the replay queued behind it
    g.replay(stream)
    try:
        with pytest.raises(npu.NpuError) as error:
            g.disable(relu)
        assert _code(error) == codes.ACL_ERROR_RT_MODEL_UPDATE_FAILED
    finally:
        event.record(updater)
    stream.synchronize()
    # a memset cannot be disabled: the graph is faulted and no longer replays
    with pytest.raises(npu.NpuError) as error:
        other.disable(memset)
    assert _code(error) == codes.ACL_ERROR_RT_PARAM_INVALID
    with pytest.raises(npu.NpuError) as error:
        other.replay(stream)
    assert _code(error) == codes.ACL_ERROR_RT_MODEL_EXECUTE
    stream.synchronize()
    for thing in (g, other, event, stream, updater):
        thing.destroy()
