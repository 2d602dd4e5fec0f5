"""The programs of examples/cann/ after the CANN runtime's built-in task, overflow and
kernel launch examples, run against a real daemon."""

from __future__ import annotations

import re

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
