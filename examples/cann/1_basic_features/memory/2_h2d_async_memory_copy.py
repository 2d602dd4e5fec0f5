"""After the CANN runtime's example/1_basic_features/memory/2_h2d_async_memory_copy.

Writes a value into page-locked host memory, queues its copy to device memory on a stream
(acl.rt.memcpy_async, ACL_MEMCPY_HOST_TO_DEVICE), synchronizes, and has a kernel read it on
the device and print it.
"""

import ctypes
import struct
import sys

import acl

SIZE = 1 << 20
VALUE = 123
# The vendor's read kernel (one int per block, printed), in Python.
KERNELS = """
from simnpu import kernel


@kernel("ptr")
def device_read(ctx, dev_ptr):
    value = int(ctx.gm(dev_ptr + 4 * ctx.block_idx, "int32", 1, access="r")[0])
    ctx.printf("Destination data: %d\\n", value)
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


def read_back(dev_ptr):
    """The int at `dev_ptr`, copied to the host (the program's own check)."""
    out = bytes(4)
    check(
        acl.rt.memcpy(acl.util.bytes_to_ptr(out), 4, dev_ptr, 4, acl.ACL_MEMCPY_DEVICE_TO_HOST),
        "memcpy",
    )
    return struct.unpack("<i", out)[0]


def main():
    check(acl.init(), "acl.init")
    device_id = 0
    check(acl.rt.set_device(device_id), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    binary, ret = acl.rt.binary_load_from_data(KERNELS, None)
    check(ret, "acl.rt.binary_load_from_data")
    device_read, ret = acl.rt.binary_get_function(binary, "device_read")
    check(ret, "acl.rt.binary_get_function")

    src, ret = acl.rt.malloc_host(SIZE)
    check(ret, "acl.rt.malloc_host")
    print(f"[INFO]  host block at {src:#x} allocated")
    dst, ret = acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    print(f"[INFO]  device block at {dst:#x} allocated")

    ctypes.c_int32.from_address(src).value = VALUE
    print(f"[INFO]  wrote {VALUE} at {src:#x}")
    print(f"[INFO]  Source data: {VALUE}")

    ret = acl.rt.memcpy_async(dst, SIZE, src, SIZE, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream)
    check(ret, "acl.rt.memcpy_async")
    print(f"[INFO]  copy {src:#x} -> {dst:#x} queued")

    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    launch(device_read, stream, "<Q", dst)

    # simnpu prints what kernels printed when the program synchronizes (docs/acl.md)
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    read = read_back(dst)

    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.free_host(src), "free")
    check(acl.rt.free(dst), "acl.rt.free")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")
    check(acl.rt.reset_device_force(device_id), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    if read != VALUE:
        print(f"[ERROR] destination holds {read}, expected {VALUE}")
        sys.exit(1)


if __name__ == "__main__":
    main()
