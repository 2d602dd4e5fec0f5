"""What a kernel sees as `ctx` on an AI core: its block, its core, and views of device
memory bounded by the allocations the launch was given (proto/kernel_abi.py states the
contract kernel authors program against)."""

from __future__ import annotations

import numpy as np

from simnpu.proto.kernel_abi import canonical_type
from simnpu.shm.addresses import split_device_address

_NUMPY_OF_CANONICAL = {
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
}


class MemoryFault(Exception):
    """A kernel asked for device memory outside the allocations it was given."""

    access: tuple[int, int, str] | None = None  # (address, bytes, access): set when checking


class KernelContext:
    """What a kernel sees as `ctx`: its block, its core, and bounded views of device memory."""

    __slots__ = ("_bounds", "_maps", "block_idx", "block_num", "core_id")

    def __init__(self, block_idx, block_num, core_id, bounds, maps):
        self.block_idx = block_idx
        self.block_num = block_num
        self.core_id = core_id
        self._bounds = bounds
        self._maps = maps

    def gm(self, ptr, dtype, count, access="rw"):
        """A numpy view of `count` elements of device memory at `ptr` (global memory).

        The view may not extend past the allocation containing `ptr`; access="r" gives
        a read-only view.
        """
        if access not in ("r", "w", "rw"):
            raise ValueError(f"access must be 'r', 'w' or 'rw', not {access!r}")
        dt = _dtype(dtype)
        count = int(count)
        if count < 0:
            raise ValueError(f"negative element count {count}")
        nbytes = count * dt.itemsize
        for start, size in self._bounds:
            if start <= ptr < start + size or (nbytes == 0 and ptr == start + size):
                if ptr + nbytes > start + size:
                    raise MemoryFault(
                        f"view of {nbytes} bytes at {ptr:#x} runs {ptr + nbytes - start - size} "
                        f"bytes past the end of its allocation [{start:#x}, +{size})"
                    )
                device, offset = split_device_address(ptr)
                view = np.frombuffer(self._maps[device], dt, count, offset)
                if access == "r":
                    view.flags.writeable = False
                return view
        raise MemoryFault(f"address {ptr:#x} is not inside any allocation passed to this kernel")


def _dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype not in ("float32", "float16", "float64"):
        try:
            return np.dtype(_NUMPY_OF_CANONICAL[canonical_type(dtype)])
        except (ValueError, KeyError):
            pass
    return np.dtype(dtype)
