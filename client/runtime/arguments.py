"""Argument checks the parts of the runtime share: what the host refuses before anything is
sent, with the code ACL's layer (100000) or the runtime's (107000) gives."""

from __future__ import annotations

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, NpuMemoryError, invalid

INT64_MAX = (1 << 63) - 1
_SIZE_T_END = 1 << 64
_ACL_MALLOC_PAD = 64  # aclrtMalloc adds 32 bytes of alignment and 32 of padding to a size


def acl_param(message: str) -> NpuError:
    """ACL's own parameter check failed (100000)."""
    return NpuError(codes.ACL_ERROR_INVALID_PARAM, message)


def wire_int(value: int, name: str) -> int:
    """`value`, checked to fit the int64 the daemon is told it in: else 107000 naming the
    parameter, before anything is sent (the session stays in step)."""
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise invalid(f"{name} {value} is out of range (at most {INT64_MAX} in magnitude)")
    return value


def check_allocatable(size: int, what: str, padded: bool = False) -> None:
    """Refuse a positive `size` beyond the int64 the daemon is told sizes in, as ACL does: a
    size no size_t holds is 107000, one that wraps when aclrtMalloc pads it (`padded`) is
    ACL's own overflow check (100000, GetAlignedAndPaddingSize), any other is the driver's
    refusal (207001: no device or host has that much memory)."""
    if size <= INT64_MAX:
        return
    if size >= _SIZE_T_END:
        raise invalid(f"size {size} of {what} does not fit a size_t")
    if padded and size > _SIZE_T_END - 1 - _ACL_MALLOC_PAD:
        raise acl_param(f"size {size} of {what} overflows a size_t once aligned and padded")
    raise NpuMemoryError(f"cannot allocate {size} bytes of {what}: more than any memory holds")
