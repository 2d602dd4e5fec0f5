"""Runs of a replay's kernels against a real daemon (server/core/tasks/kernel_run.py): the
single-block launches a graph recorded one after the other on a stream go to one core as
one item, and behave exactly as the launches did one by one -- results, a failure naming
the captured call of the kernel that failed, the STOP failure mode, device printf in order,
abort."""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest
from conftest import GATE

N = 64
STEPS = """
from simnpu import kernel

@kernel("ptr", "u32", "u32")
def step(ctx, x, n, k):
    view = ctx.gm(x, "int64", n)
    lo, hi = n * ctx.block_idx // ctx.block_num, n * (ctx.block_idx + 1) // ctx.block_num
    view[lo:hi] = view[lo:hi] * 3 + k

@kernel("ptr", "u32", "u32")
def fails_at(ctx, x, n, k):
    raise ValueError(f"kernel {k} fails")

@kernel("ptr", "u32", "u32")
def says(ctx, x, n, k):
    ctx.printf("kernel %u\\n", k)
"""


@pytest.fixture
def steps(acl):
    binary, ret = acl.rt.binary_load_from_data(STEPS, None)
    assert ret == 0
    functions = {}
    for name in ("step", "fails_at", "says"):
        functions[name], ret = acl.rt.binary_get_function(binary, name)
        assert ret == 0
    x, ret = acl.rt.malloc(N * 8, 0)
    assert ret == 0
    stream, ret = acl.rt.create_stream()
    assert ret == 0

    class Steps:
        def __init__(self) -> None:
            self.stream, self.x = stream, x

        def function(self, name: str) -> int:
            return functions[name]

        def launch(self, name: str, k: int, blocks: int = 1) -> int:
            args = struct.pack("<QII", x, N, k)
            return acl.rt.launch_kernel_with_host_args(
                functions[name], blocks, stream, None, acl.util.bytes_to_ptr(args), len(args)
            )

        def write(self, values: np.ndarray) -> None:
            data = np.ascontiguousarray(values, np.int64).tobytes()
            assert acl.rt.memcpy(x, N * 8, acl.util.bytes_to_ptr(data), N * 8, 1) == 0

        def read(self) -> np.ndarray:
            out = bytes(N * 8)
            assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), N * 8, x, N * 8, 2) == 0
            return np.frombuffer(out, np.int64).copy()

        def capture(self, launches) -> int:
            assert acl.mdl.ri_capture_begin(stream, 0) == 0
            launches()
            model, ret = acl.mdl.ri_capture_end(stream)
            assert ret == 0, acl.get_recent_err_msg()
            return model

    yield Steps()
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(x) == 0
    assert acl.rt.binary_unload(binary) == 0


def _expected(start: np.ndarray, ks) -> np.ndarray:
    values = start.copy()
    for k in ks:
        values = values * 3 + k
    return values


def test_a_replayed_run_computes_what_the_launches_did(acl, steps):
    ks = list(range(1, 200))  # a graph of 199 kernels, and one with 2 blocks in the middle

    def launches() -> None:
        for k in ks:
            assert steps.launch("step", k, blocks=2 if k == 100 else 1) == 0

    start = np.arange(N, dtype=np.int64) % 7
    steps.write(start)
    launches()
    assert acl.rt.synchronize_stream(steps.stream) == 0
    eager = steps.read()
    assert np.array_equal(eager, _expected(start, ks))
    model = steps.capture(launches)
    for _ in range(3):
        steps.write(start)
        assert acl.mdl.ri_execute_async(model, steps.stream) == 0
        assert acl.rt.synchronize_stream(steps.stream) == 0
        assert np.array_equal(steps.read(), eager)
    assert acl.mdl.ri_destroy(model) == 0


def _capture_with_a_failure(acl, steps) -> tuple[int, int]:
    """A graph of step 1, step 2, the failing kernel, step 3 (one run); and the line that
    captured the failing one (the steps are captured at another line)."""

    def launches() -> None:
        assert steps.launch("step", 1) == 0
        assert steps.launch("step", 2) == 0
        function, args = steps.function("fails_at"), struct.pack("<QII", steps.x, N, 7)
        ptr = acl.util.bytes_to_ptr(args)
        launches.line = sys._getframe().f_lineno + 1  # type: ignore[attr-defined]
        assert acl.rt.launch_kernel_with_host_args(function, 1, steps.stream, None, ptr, 16) == 0
        assert steps.launch("step", 3) == 0

    model = steps.capture(launches)
    return model, launches.line  # type: ignore[attr-defined]


def test_a_failure_in_a_run_names_the_kernel_that_failed_and_the_rest_runs(acl, steps):
    model, line = _capture_with_a_failure(acl, steps)
    start = np.ones(N, np.int64)
    steps.write(start)
    assert acl.mdl.ri_execute_async(model, steps.stream) == 0
    assert acl.rt.synchronize_stream(steps.stream) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
    message = acl.get_recent_err_msg()
    assert "kernel 7 fails" in message
    assert f"test_replay_runs.py:{line}" in message
    # the default failure mode goes on after a failure, as the eager launches do
    assert np.array_equal(steps.read(), _expected(start, [1, 2, 3]))
    assert acl.rt.synchronize_stream(steps.stream) == 0  # reported once
    assert acl.mdl.ri_destroy(model) == 0


def test_stop_on_failure_ends_a_run_at_the_kernel_that_failed(acl, steps):
    model, _ = _capture_with_a_failure(acl, steps)
    assert acl.rt.set_stream_failure_mode(steps.stream, acl.ACL_STOP_ON_FAILURE) == 0
    start = np.ones(N, np.int64)
    steps.write(start)
    assert acl.mdl.ri_execute_async(model, steps.stream) == 0
    assert acl.rt.synchronize_stream(steps.stream) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "kernel 7 fails" in acl.get_recent_err_msg()
    assert np.array_equal(steps.read(), _expected(start, [1, 2]))  # step 3 never ran
    assert acl.mdl.ri_destroy(model) == 0


def test_device_printf_of_a_run_comes_in_kernel_order(acl, steps, capfd):
    def launches() -> None:
        for k in range(5):
            assert steps.launch("says", k) == 0

    model = steps.capture(launches)
    capfd.readouterr()
    assert acl.mdl.ri_execute_async(model, steps.stream) == 0
    assert acl.rt.synchronize_stream(steps.stream) == 0
    printed = [line for line in capfd.readouterr().out.splitlines() if line.startswith("kernel")]
    assert printed == [f"kernel {k}" for k in range(5)]
    assert acl.mdl.ri_destroy(model) == 0


def test_abort_ends_a_run_that_is_running(acl, steps):
    gate_binary, ret = acl.rt.binary_load_from_data(GATE, None)
    assert ret == 0
    gate, _ = acl.rt.binary_get_function(gate_binary, "gate")
    flag, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memset(flag, 64, 0, 64) == 0
    gate_args = struct.pack("<Qd", flag, 120.0)

    def launches() -> None:  # the gate and the step: the same client's kernels, one run
        ptr = acl.util.bytes_to_ptr(gate_args)
        assert acl.rt.launch_kernel_with_host_args(gate, 1, steps.stream, None, ptr, 16) == 0
        assert steps.launch("step", 5) == 0

    model = steps.capture(launches)
    start = np.ones(N, np.int64)
    steps.write(start)
    assert acl.mdl.ri_execute_async(model, steps.stream) == 0
    assert acl.mdl.ri_get_id(model)[1] == 0  # answered after the replay started
    assert acl.mdl.ri_abort(model) == 0
    assert acl.rt.synchronize_stream(steps.stream) == acl.ACL_ERROR_RT_MODEL_ABORT_NORMAL
    assert np.array_equal(steps.read(), start)  # the step behind the gate never ran
    one = struct.pack("<i", 1)
    assert acl.rt.memcpy(flag, 4, acl.util.bytes_to_ptr(one), 4, 1) == 0
    assert acl.mdl.ri_execute_async(model, steps.stream) == 0
    assert acl.rt.synchronize_stream(steps.stream) == 0
    assert np.array_equal(steps.read(), _expected(start, [5]))
    assert acl.mdl.ri_destroy(model) == 0
    assert acl.rt.free(flag) == 0
    assert acl.rt.binary_unload(gate_binary) == 0
