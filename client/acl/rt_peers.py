"""acl.rt peer-access calls between the daemon's devices (client/runtime/devices.py).

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = [
    "device_can_access_peer",
    "device_disable_peer_access",
    "device_enable_peer_access",
    "device_peer_access_status",
]


@api("ii", (0,))
def device_can_access_peer(rt, device_id, peer_device_id):
    """aclrtDeviceCanAccessPeer: `can_access_peer (1 or 0), ret`; 100000 when the two are the
    same device, 107001 for a device that does not exist."""
    return rt.devices.device_can_access_peer(device_id, peer_device_id)


@api("iI")
def device_enable_peer_access(rt, peer_device_id, flags):
    """aclrtDeviceEnablePeerAccess: the current device may reach the peer's memory (one
    direction); flags must be 0 (200006 otherwise)."""
    rt.devices.device_enable_peer_access(peer_device_id, flags)


@api("i")
def device_disable_peer_access(rt, peer_device_id):
    """aclrtDeviceDisablePeerAccess: the current device no longer reaches the peer's memory."""
    rt.devices.device_disable_peer_access(peer_device_id)


@api("ii", (0,))
def device_peer_access_status(rt, device_id, peer_device_id):
    """aclrtDevicePeerAccessStatus: `status (1 enabled, 0 not), ret`."""
    return rt.devices.device_peer_access_status(device_id, peer_device_id)


__getattr__, __dir__ = _on_demand(globals())
