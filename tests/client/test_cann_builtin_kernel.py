"""The programs of examples/cann/ after the CANN runtime's built-in task, overflow and
kernel launch examples, run against a real daemon."""

from __future__ import annotations

import re

import pytest
from cann_examples import run_cann_example


def test_reduce_task(daemon):
    out = run_cann_example(daemon.address, "2_advanced_features/built_in_task/0_reduce_task.py")
    for index, value in enumerate(("2.000000", "4.000000", "6.000000", "8.000000")):
        assert f"Reduce SUM result[{index}] = {value}" in out
    assert out.rstrip().endswith("Sample Run Successfully.")


def test_random_num_task(daemon):
    program = "2_advanced_features/built_in_task/1_random_num_task.py"
    out = run_cann_example(daemon.address, program)
    assert out.count("Random result[") == 25
    for title in (
        "Gen normal distribution random num, data type: float",
        "Gen truncated normal distribution random num, data type: BF16",
        "Gen uniform distribution random num, data type: FP16",
        "Gen uniform distribution random num, data type: INT32",
        "Gen dropout bitmask, output data type: UINT8",
    ):
        assert title in out
    ints = [int(v) for v in re.findall(r"INT32 \n(?:Random result\[\d\] = (-?\d+)\n?)", out)]
    assert all(1 <= v < 100 for v in ints)
    assert out.rstrip().endswith("Sample Run Successfully.")
    assert run_cann_example(daemon.address, program) == out  # the same seed, the same numbers


def test_overflow_detection(daemon):
    out = run_cann_example(
        daemon.address, "4_reliability/overflow_detection/0_overflow_detection.py"
    )
    assert out.splitlines() == [
        "[INFO]  Device saturation mode switched from ACL_RT_OVERFLOW_MODE_INFNAN to "
        "ACL_RT_OVERFLOW_MODE_SATURATION.",
        "[INFO]  Overflow switch=1",
        "[INFO]  Overflow status before reset=0",
        "[INFO]  Overflow status after reset=0",
        "[INFO]  Overflow detection sample finished successfully.",
    ]


@pytest.mark.parametrize("mode", ["simple", "placeholder"])
def test_launch_kernel(daemon, mode):
    out = run_cann_example(daemon.address, "2_advanced_features/kernel/0_launch_kernel.py", mode)
    assert f"[INFO]  Kernel launch sample runs in {mode} mode." in out
    assert "[INFO]  Run the launch_kernel sample successfully." in out
    assert "error ratio: 0.0000, tolerance: 0.0010" in out
    assert "data index:" not in out
    assert out.rstrip().endswith("[SUCCESS] result correct")


def test_launch_kernel_with_reslimit(start_daemon):
    daemon = start_daemon("--ai-cores", "8")  # the sample limits itself to 8 cube cores
    program = "2_advanced_features/kernel/1_launch_kernel_with_reslimit.py"
    out = run_cann_example(daemon.address, program)
    assert "[INFO]  Device resource limit type 0 set to 8." in out
    assert "[INFO]  Current device resource limit type 0 is 8." in out
    assert out.splitlines().count("Hello World") == 8
    blocks = re.findall(r"opType=KernelPrint, DumpHead: AIV-(\d), CoreType=AIV, block dim=8,", out)
    assert sorted(blocks) == [str(block) for block in range(8)]
    assert "[INFO]  Run the launch_kernel_with_reslimit sample successfully." in out
    assert out.rstrip().endswith("[SUCCESS] Launch kernels under resource limits successfully.")
