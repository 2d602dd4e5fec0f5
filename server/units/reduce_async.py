"""aclrtReduceAsync on a copy engine: dst = dst (op) src, element-wise, in place.

A float SUM that overflows raises the overflow flag, so the task's context's overflow status
is set as a kernel's is; its result is inf in the Inf/NaN mode and the type's largest finite
value in the saturation mode (NaN: 0), as its stream's mode says (docs/acl.md, "Float
overflow"). Integers wrap (two's complement), as the HCCL reductions do.
Runs in a worker on the unit's device mappings (by segment name).
"""

from __future__ import annotations

import time
import traceback

import numpy as np

from simnpu.proto import codes
from simnpu.server.core.unit_protocol import ReduceBytes, Result
from simnpu.server.units.float_overflow import OverflowFlag, saturate

_UFUNCS = {
    codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM: np.add,
    codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_MAX: np.maximum,
    codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_MIN: np.minimum,
}


def dtype(name: str) -> np.dtype:
    """The numpy dtype of a name ("bfloat16" from ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def execute(maps: dict, item: ReduceBytes, overflow: OverflowFlag) -> Result:
    """Run one piece of a reduce; `overflow` is the unit's flag (numpy's error callback)."""
    start = time.monotonic_ns()
    overflow.raised = False
    try:
        kind = dtype(item.dtype)
        count = item.count // kind.itemsize
        dst = np.frombuffer(maps[item.dst.segment], kind, count, item.dst.offset)
        src = np.frombuffer(maps[item.src.segment], kind, count, item.src.offset)
        with np.errstate(over="call", invalid="ignore", divide="ignore", under="ignore"):
            _UFUNCS[item.kind](dst, src, out=dst)
        if item.saturation:
            saturate(dst)
    except BaseException as exc:
        return Result(
            item.token,
            codes.ACL_ERROR_RT_SYS_DMA,
            start,
            time.monotonic_ns(),
            "reduce failed:\n" + "".join(traceback.format_exception(exc)),
        )
    return Result(item.token, 0, start, time.monotonic_ns(), "", overflow=overflow.raised)
