"""acl.rt float overflow calls: the saturation mode, streams' overflow switches, and the
overflow status kernels raise (client/runtime/devices.py, server/units/float_overflow.py).

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = [
    "get_device_sat_mode",
    "get_overflow_status",
    "get_stream_overflow_switch",
    "reset_overflow_status",
    "set_device_sat_mode",
    "set_stream_overflow_switch",
]


@api("i")
def set_device_sat_mode(rt, mode, *, site):
    """aclrtSetDeviceSatMode: ACL_RT_OVERFLOW_MODE_SATURATION or _INFNAN for the streams
    created from now on (those created before keep theirs); any other value 107000."""
    rt.devices.set_device_sat_mode(mode, site=site)


@api("", (0,))
def get_device_sat_mode(rt):
    """aclrtGetDeviceSatMode: `mode, ret`, the mode last set (ACL_RT_OVERFLOW_MODE_INFNAN
    until then)."""
    return rt.devices.get_device_sat_mode()


@api("kI")
def set_stream_overflow_switch(rt, stream, flag):
    """aclrtSetStreamOverflowSwitch: flag 0 or 1 (else 100000)."""
    rt.streams.set_stream_overflow_switch(stream, flag)


@api("k", (0,))
def get_stream_overflow_switch(rt, stream):
    """aclrtGetStreamOverflowSwitch: `flag, ret` (0 until set)."""
    return rt.streams.get_stream_overflow_switch(stream)


@api("kkk", nonnull=("output_addr",))
def get_overflow_status(rt, output_addr, output_size, stream, *, site):
    """aclrtGetOverflowStatus (async): when the stream gets there it writes its context's
    overflow status to the 64 bytes at output_addr (device memory; a uint64, 1 if a kernel
    raised the overflow flag since the last reset); output_size must be 64 (else 107000).
    Synchronize the stream before reading it."""
    rt.devices.get_overflow_status(output_addr, output_size, stream, site=site)


@api("k")
def reset_overflow_status(rt, stream, *, site):
    """aclrtResetOverflowStatus (async): clears the context's overflow status in stream order."""
    rt.devices.reset_overflow_status(stream, site=site)


__getattr__, __dir__ = _on_demand(globals())
