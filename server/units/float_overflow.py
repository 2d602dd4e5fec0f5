"""Float overflow on the units: what a kernel raises, and saturation.

A kernel raises its launch's overflow flag with `ctx.raise_overflow()`; in the daemon's
workers and kernel processes any numpy floating-point overflow raises it too (`watch_numpy`),
so the built-in kernels raise it on float overflow. The flag travels in the launch's Result;
the scheduler sets the overflow status of the launch's context (`Context.overflow`), which
the overflow status tasks read and clear (server/core/tasks/overflow.py, which also writes
what aclrtGetOverflowStatus reads).

The float overflow mode (aclrtSetDeviceSatMode) is a stream's, taken when it is created, and
travels with each task of it (RunKernel.saturation, ReduceBytes.saturation). In the Inf/NaN
mode float results are what IEEE arithmetic gives; in the saturation mode the built-in
kernels and reduces saturate theirs (`saturate`), and a kernel sees the mode as
`ctx.saturation`. Both modes raise the overflow flag alike.
"""

from __future__ import annotations

import numpy as np


class OverflowFlag:
    """A unit's overflow flag for the kernel it runs."""

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False

    def set(self, *_: object) -> None:
        """Raise it (also numpy's error callback: it passes the error and its flag)."""
        self.raised = True


def watch_numpy(flag: OverflowFlag) -> None:
    """Any floating-point overflow numpy meets in this process raises `flag` (a worker's or
    a kernel process's: one unit each)."""
    np.seterrcall(flag.set)
    np.seterr(over="call")


def saturate(values: np.ndarray) -> None:
    """ACL_RT_OVERFLOW_MODE_SATURATION on float results, in place: +-inf become the type's
    largest finite value of that sign, NaN becomes 0; other types are left alone."""
    kind = values.dtype
    if kind.kind == "f":
        largest = np.finfo(kind).max
    elif kind.name == "bfloat16":
        import ml_dtypes

        largest = ml_dtypes.finfo(kind).max
    else:
        return
    np.clip(values, -largest, largest, out=values)
    np.copyto(values, 0, where=np.isnan(values))
