"""After the CANN runtime's example/1_basic_features/memory/4_d2h_async_memory_copy.

A kernel writes a value into device memory (printing it) and an acl.rt.memcpy_async
(ACL_MEMCPY_DEVICE_TO_HOST) queued behind it on the same stream copies it into page-locked
host memory; once the stream is synchronized the program reads it there. Stream order
alone puts the copy after the kernel.
"""

import ctypes
import struct
import sys

import acl

SIZE = 1 << 20
VALUE = 123
# The vendor's write kernel (one int per block, printed), in Python.
KERNELS = """
from simnpu import kernel


@kernel("ptr", "i32")
def device_write(ctx, dev_ptr, value):
    ctx.gm(dev_ptr + 4 * ctx.block_idx, "int32", 1, access="w")[0] = value
    ctx.printf("Source data: %d\\n", value)
"""


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {what} returned {ret}: {acl.get_recent_err_msg()}")
        sys.exit(1)


def launch(function, stream, fmt, *values):
    """One block of `function` with its arguments packed as `fmt`."""
    args = struct.pack(fmt, *values)
    ptr = acl.util.bytes_to_ptr(args)
    check(acl.rt.launch_kernel_with_host_args(function, 1, stream, None, ptr, len(args)), "launch")


def main():
    check(acl.init(), "acl.init")
    device_id = 0
    check(acl.rt.set_device(device_id), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    binary, ret = acl.rt.binary_load_from_data(KERNELS, None)
    check(ret, "acl.rt.binary_load_from_data")
    device_write, ret = acl.rt.binary_get_function(binary, "device_write")
    check(ret, "acl.rt.binary_get_function")

    host, ret = acl.rt.malloc_host(SIZE)
    check(ret, "acl.rt.malloc_host")
    print(f"[INFO]  host block at {host:#x} allocated")
    dev, ret = acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    print(f"[INFO]  device block at {dev:#x} allocated")

    launch(device_write, stream, "<Qi", dev, VALUE)
    print(f"[INFO]  kernel writing {VALUE} at {dev:#x} queued")

    ret = acl.rt.memcpy_async(host, SIZE, dev, SIZE, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream)
    check(ret, "acl.rt.memcpy_async")
    print(f"[INFO]  copy {dev:#x} -> {host:#x} queued")

    # the host block holds the value once the stream has run the copy
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    read = ctypes.c_int32.from_address(host).value
    print(f"[INFO]  Destination data: {read}")

    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.free_host(host), "acl.rt.free_host")
    check(acl.rt.free(dev), "acl.rt.free")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")
    check(acl.rt.reset_device_force(device_id), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    if read != VALUE:
        print(f"[ERROR] host block holds {read}, expected {VALUE}")
        sys.exit(1)


if __name__ == "__main__":
    main()
