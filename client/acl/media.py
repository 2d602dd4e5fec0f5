"""acl.media: device memory for media buffers. DVPP processing itself is not simulated."""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand
from simnpu.proto import codes


@api("k", (0,))
def dvpp_malloc(rt, size, *, site):
    """acldvppMalloc: `device_pointer, ret` -- device memory, usable by every rt call."""
    return rt.memory.malloc(size, codes.ACL_MEM_MALLOC_HUGE_FIRST, site=site)


@api("k")
def dvpp_free(rt, dev_ptr, *, site):
    """acldvppFree."""
    rt.memory.free(dev_ptr, site=site)


def _not_provided(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"acl.media.{name} is not provided by simnpu: DVPP media processing (image and "
        "video codecs, VPC) is not simulated; only dvpp_malloc and dvpp_free are"
    )


__getattr__, __dir__ = _on_demand(globals(), missing=_not_provided)
