"""acl.rt stream memory operations: a 64-bit word of device memory written, or waited on,
in stream order (client/runtime/notifies.py, server/core/tasks/value.py).

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = ["value_wait", "value_write"]


@api("kKIk", nonnull=("dev_addr",), delegate="notifies.value_write")
def value_write(rt, dev_addr, value, flag, stream):
    """aclrtValueWrite (async): write the 64-bit `value` at `dev_addr` (8-byte aligned, in
    this process's device memory) when the stream gets there; flag is reserved (0)."""


@api("kKIk", nonnull=("dev_addr",), delegate="notifies.value_wait")
def value_wait(rt, dev_addr, value, flag, stream):
    """aclrtValueWait (async): the stream waits until the 64-bit word at `dev_addr` meets
    `flag`: ACL_STREAM_WAIT_VALUE_GEQ (0, (int64)(word - value) >= 0), _EQ (1), _AND (2,
    word & value != 0) or _NOR (3, ~(word | value) != 0)."""


__getattr__, __dir__ = _on_demand(globals())
