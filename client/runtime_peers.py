"""The raw layer's peer-access calls: which devices of the daemon may reach each other's
memory, and the rule copies between two devices follow.

A mixin of `Runtime` (client/runtime.py). Peer access is this process's state, kept here:
aclrtDeviceEnablePeerAccess(peer) from device d lets d reach peer's memory, one direction
only (the CANN runtime's API reference, aclrtDeviceEnablePeerAccess); a copy between
memory of two devices runs on the device of its stream (for aclrtMemcpy, the current
device), which must be one of the two and have enabled access to the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.client.last_error import records_errors
from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid
from simnpu.shm.addresses import split_device_address

if TYPE_CHECKING:
    from simnpu.client.runtime import ContextInfo


class RuntimePeers:
    # what the mixin uses of Runtime (client/runtime.py), which sets all of it
    device_count: int
    peer_access: set[tuple[int, int]]  # (device, peer): device may reach peer's memory

    if TYPE_CHECKING:

        def _current(self) -> ContextInfo: ...
        def _check_device(self, device: int) -> None: ...

    def _peer_pair(self, device: int, peer: int) -> None:
        """Both exist (107001) and differ (100000, as ACL checks before the runtime)."""
        self._check_device(device)
        self._check_device(peer)
        if device == peer:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"deviceId {device} cannot be equal to peerDeviceId {peer}",
            )

    @records_errors
    def device_can_access_peer(self, device: int, peer: int) -> int:
        """aclrtDeviceCanAccessPeer: 1 -- every two devices of one daemon can."""
        self._peer_pair(device, peer)
        return 1

    @records_errors
    def device_enable_peer_access(self, peer: int, flags: int) -> None:
        """aclrtDeviceEnablePeerAccess: the current device may reach `peer`'s memory
        (flags is reserved: anything but 0 is ACL_ERROR_FEATURE_UNSUPPORTED)."""
        if flags != 0:
            raise NpuError(
                codes.ACL_ERROR_FEATURE_UNSUPPORTED, f"flags {flags:#x} is reserved and must be 0"
            )
        device = self._current().device
        self._peer_pair(device, peer)
        self.peer_access.add((device, peer))

    @records_errors
    def device_disable_peer_access(self, peer: int) -> None:
        """aclrtDeviceDisablePeerAccess: the current device no longer reaches `peer`."""
        device = self._current().device
        self._peer_pair(device, peer)
        self.peer_access.discard((device, peer))

    @records_errors
    def device_peer_access_status(self, device: int, peer: int) -> int:
        """aclrtDevicePeerAccessStatus: 1 when `device` has enabled access to `peer`, else 0
        (107000 for a device outside [0, count), as the runtime's reference says)."""
        for value in (device, peer):
            if not 0 <= value < self.device_count:
                raise invalid(f"device {value} is outside [0, {self.device_count})")
        return int((device, peer) in self.peer_access)

    def device_of(self, address: int) -> int:
        """The device of this process's memory at `address` (checked before)."""
        return split_device_address(address)[0]

    def check_peer_copy(self, src: int, dst: int, device: int) -> None:
        """A copy from `src` to `dst` (device memory of this process) run by `device`: between
        two devices it needs `device` to be one of them with access enabled to the other."""
        src_device, dst_device = self.device_of(src), self.device_of(dst)
        if src_device == dst_device:
            return
        other = dst_device if device == src_device else src_device
        if device not in (src_device, dst_device) or (device, other) not in self.peer_access:
            raise invalid(
                f"a copy from device {src_device} to device {dst_device} runs on device "
                f"{device}, which has not enabled peer access to device {other}: call "
                f"aclrtDeviceEnablePeerAccess({other}, 0) with device {device} current"
            )
