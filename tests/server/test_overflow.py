"""The overflow flag on the unit's side: ctx.raise_overflow, numpy float overflow in a
process that watches it, and what aclrtGetOverflowStatus writes."""

from __future__ import annotations

import numpy as np

from simnpu.server.core.tasks.overflow import OUTPUT_SIZE, status_bytes
from simnpu.server.core.unit_protocol import LoadModule, RunKernel
from simnpu.server.units.float_overflow import OverflowFlag, saturate, watch_numpy
from simnpu.server.units.runner import WorkRunner

MODULE = """
import numpy as np
from simnpu import kernel

@kernel("u32")
def raises(ctx, n):
    if ctx.block_idx == n:
        ctx.raise_overflow()

@kernel("u32")
def overflows_f16(ctx, n):
    np.float16(60000) * np.float16(n)
"""


def run(runner: WorkRunner, name: str, n: int) -> tuple:
    (result,) = runner.run([RunKernel.pack(7, 1, name, (n,), 0, 3, 3, (), False)], set)
    return result


def new_runner() -> WorkRunner:
    runner = WorkRunner(0, [bytearray(4096)], ["seg"], lambda report: None)
    runner.run([LoadModule.pack(1, MODULE, "<test>")], set)
    return runner


def test_a_block_that_raises_the_flag_raises_its_launch_s():
    runner = new_runner()
    assert run(runner, "raises", 1).overflow is True
    assert run(runner, "raises", 5).overflow is False  # no such block: the flag is per launch


def test_numpy_float_overflow_raises_it_where_it_is_watched():
    runner = new_runner()
    old_call, old_err = np.geterrcall(), np.geterr()
    try:
        watch_numpy(runner.overflow)
        assert run(runner, "overflows_f16", 2).overflow is True
        assert run(runner, "overflows_f16", 1).overflow is False
    finally:
        np.seterrcall(old_call)
        np.seterr(**old_err)
    flag = OverflowFlag()
    flag.set("overflow", 1)  # as numpy calls it
    assert flag.raised


def test_the_status_is_a_uint64_then_zeros():
    assert status_bytes(True) == (1).to_bytes(8, "little") + bytes(56)
    assert status_bytes(False) == bytes(OUTPUT_SIZE)


def test_saturate_clamps_infinities_and_zeroes_nans_of_float_types_only():
    import ml_dtypes

    for kind in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16):
        values = np.array([np.inf, -np.inf, np.nan, 1.5, -2.0], kind)
        saturate(values)
        largest = ml_dtypes.finfo(kind).max
        assert values.tolist() == [largest, -largest, 0.0, 1.5, -2.0], kind
    ints = np.array([-1, 7], np.int32)
    saturate(ints)
    assert ints.tolist() == [-1, 7]
