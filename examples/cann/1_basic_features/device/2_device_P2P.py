"""Follows the CANN runtime's example/1_basic_features/device/2_device_P2P.

A copy from one device's memory straight into another's. With at least two devices, the
program asks whether device 0 can reach device 1 (aclrtDeviceCanAccessPeer); if so it
enables access in both directions (aclrtDeviceEnablePeerAccess, from each device in
turn), fills 10 bytes of device 0 with a value, copies them into device 1's memory
(aclrtMemcpy, device to device, from device 1), copies those back to pinned host memory
and checks the first byte. Then it disables peer access and releases both devices
(aclrtResetDeviceForce). With fewer than two devices it says so and stops.

The vendor program fills with C's `rand() % 256` without seeding: 103 with glibc, the
value used here.

Run: python examples/cann/1_basic_features/device/2_device_P2P.py   (needs a daemon with
`--devices 2`)
"""

import ctypes
import sys

import acl

MEM_SIZE = 10
FILL_VALUE = 1804289383 % 256  # glibc's first unseeded rand(), modulo 256


class Failed(Exception):
    """A call returned an error code; the message names it."""


def check(ret: int, call: str) -> None:
    if ret != acl.ACL_SUCCESS:
        raise Failed(f"{call} returned error code {ret}: {acl.get_recent_err_msg()}")


def copy_between_devices() -> bool:
    """Devices 0 and 1 with peer access: fill, copy across, read back. True if it matched."""
    check(acl.rt.device_enable_peer_access(1, 0), "acl.rt.device_enable_peer_access(1)")
    dev0, ret = acl.rt.malloc(MEM_SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST_P2P)
    check(ret, "acl.rt.malloc (device 0)")
    check(acl.rt.memset(dev0, MEM_SIZE, FILL_VALUE, MEM_SIZE), "acl.rt.memset (device 0)")

    check(acl.rt.set_device(1), "acl.rt.set_device(1)")
    check(acl.rt.device_enable_peer_access(0, 0), "acl.rt.device_enable_peer_access(0)")
    dev1, ret = acl.rt.malloc(MEM_SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST_P2P)
    check(ret, "acl.rt.malloc (device 1)")
    check(acl.rt.memset(dev1, MEM_SIZE, 0, MEM_SIZE), "acl.rt.memset (device 1)")

    ret = acl.rt.memcpy(dev1, MEM_SIZE, dev0, MEM_SIZE, acl.ACL_MEMCPY_DEVICE_TO_DEVICE)
    check(ret, "acl.rt.memcpy (device 0 to device 1)")
    print("[INFO]  Copied device 0's bytes into device 1.")

    host, ret = acl.rt.malloc_host(MEM_SIZE)
    check(ret, "acl.rt.malloc_host")
    check(acl.rt.memset(host, MEM_SIZE, 0, MEM_SIZE), "acl.rt.memset (host)")
    ret = acl.rt.memcpy(host, MEM_SIZE, dev1, MEM_SIZE, acl.ACL_MEMCPY_DEVICE_TO_HOST)
    check(ret, "acl.rt.memcpy (device 1 to host)")
    print("[INFO]  Copied device 1's bytes to the host.")
    first = ctypes.c_char.from_address(host).value[0]
    matched = first == FILL_VALUE
    if matched:
        print(f"[INFO]  The first byte read back is {first}: as written on device 0.")
    else:
        print(f"[ERROR]  The first byte read back is {first}, not {FILL_VALUE}.")

    check(acl.rt.synchronize_device(), "acl.rt.synchronize_device")
    check(acl.rt.device_disable_peer_access(0), "acl.rt.device_disable_peer_access(0)")
    check(acl.rt.free_host(host), "acl.rt.free_host")
    check(acl.rt.free(dev1), "acl.rt.free (device 1)")
    check(acl.rt.reset_device_force(1), "acl.rt.reset_device_force(1)")

    check(acl.rt.set_device(0), "acl.rt.set_device(0)")
    check(acl.rt.device_disable_peer_access(1), "acl.rt.device_disable_peer_access(1)")
    check(acl.rt.free(dev0), "acl.rt.free (device 0)")
    check(acl.rt.reset_device_force(0), "acl.rt.reset_device_force(0)")
    return matched


def main() -> int:
    print("[INFO]  device_P2P: starting.")
    check(acl.init(), "acl.init")
    count, ret = acl.rt.get_device_count()
    check(ret, "acl.rt.get_device_count")
    if count < 2:
        print(f"[INFO]  [SKIP] peer copies need two devices; this daemon has {count}.")
        check(acl.finalize(), "acl.finalize")
        return 0

    check(acl.rt.set_device(0), "acl.rt.set_device(0)")
    can_access, ret = acl.rt.device_can_access_peer(0, 1)
    check(ret, "acl.rt.device_can_access_peer")
    matched = True
    if can_access == 1:
        matched = copy_between_devices()
    else:
        print("[ERROR]  Device 0 cannot access device 1's memory.")
    check(acl.finalize(), "acl.finalize")
    if can_access != 1 or not matched:
        return 1
    print("[INFO]  device_P2P: done.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as failure:
        print(f"[ERROR]  {failure}")
        sys.exit(1)
