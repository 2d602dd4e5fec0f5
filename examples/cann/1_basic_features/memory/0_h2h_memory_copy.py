"""After the CANN runtime's example/1_basic_features/memory/0_h2h_memory_copy.

Copies a value between two blocks of page-locked host memory (acl.rt.malloc_host) with a
synchronous acl.rt.memcpy of kind ACL_MEMCPY_HOST_TO_HOST, and reads it back on the host.
"""

import ctypes
import sys

import acl

SIZE = 1 << 20
VALUE = 123


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {what} returned {ret}: {acl.get_recent_err_msg()}")
        sys.exit(1)


def main():
    check(acl.init(), "acl.init")
    device_id = 0
    check(acl.rt.set_device(device_id), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")

    host_a, ret = acl.rt.malloc_host(SIZE)
    check(ret, "acl.rt.malloc_host")
    print(f"[INFO]  host block A at {host_a:#x} allocated")
    host_b, ret = acl.rt.malloc_host(SIZE)
    check(ret, "acl.rt.malloc_host")
    print(f"[INFO]  host block B at {host_b:#x} allocated")

    ctypes.c_int32.from_address(host_a).value = VALUE
    print(f"[INFO]  wrote {VALUE} at {host_a:#x}")
    print(f"[INFO]  Source data: {VALUE}")

    check(acl.rt.memcpy(host_b, SIZE, host_a, SIZE, acl.ACL_MEMCPY_HOST_TO_HOST), "memcpy")
    print(f"[INFO]  copied {host_a:#x} -> {host_b:#x}")

    read = ctypes.c_int32.from_address(host_b).value
    print(f"[INFO]  Destination data: {read}")

    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.free_host(host_a), "acl.rt.free_host")
    check(acl.rt.free_host(host_b), "acl.rt.free_host")
    check(acl.rt.reset_device_force(device_id), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    if read != VALUE:
        print(f"[ERROR] destination holds {read}, expected {VALUE}")
        sys.exit(1)


if __name__ == "__main__":
    main()
