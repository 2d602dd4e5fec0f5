"""acl.rt IPC event calls: an event created with ACL_EVENT_IPC shared with other processes
by its 64-byte handle (client/runtime/events.py, server/core/ipc_events.py).

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last. The
aclrtIpcEventHandle struct is `bytes` of its 64 bytes.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = ["ipc_get_event_handle", "ipc_open_event_handle"]


@api("k", (b"",))
def ipc_get_event_handle(rt, event, *, site):
    """aclrtIpcGetEventHandle: `handle (64 bytes), ret` of an event created with
    create_event_ex_with_flag(ACL_EVENT_IPC); 107000 for another event. Blocks."""
    return rt.events.ipc_get_event_handle(event, site=site)


@api("O", (0,))
def ipc_open_event_handle(rt, handle, *, site):
    """aclrtIpcOpenEventHandle: `event, ret` in the current context, for another process's
    handle; 107000 for a handle no live IPC event has. The event can be recorded, waited
    for, synchronized, queried with query_event_status and destroyed. Blocks."""
    if not isinstance(handle, bytes | bytearray | memoryview):
        raise TypeError("acl.rt.ipc_open_event_handle: handle must be the 64 bytes of a handle")
    return rt.events.ipc_open_event_handle(bytes(handle), site=site)


__getattr__, __dir__ = _on_demand(globals())
