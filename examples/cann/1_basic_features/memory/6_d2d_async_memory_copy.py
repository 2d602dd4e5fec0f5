"""After the CANN runtime's example/1_basic_features/memory/6_d2d_async_memory_copy.

A kernel writes a value into device memory A (printing it), an acl.rt.memcpy_async
(ACL_MEMCPY_DEVICE_TO_DEVICE) queued behind it on the same stream copies A to B, and after
a synchronize a kernel reads B on the device and prints it.
"""

import struct
import sys

import acl

SIZE = 1 << 20
VALUE = 123
# The vendor's kernels (a write and a read of one int per block, each printing it), in Python.
KERNELS = """
from simnpu import kernel


@kernel("ptr", "i32")
def device_write(ctx, dev_ptr, value):
    ctx.gm(dev_ptr + 4 * ctx.block_idx, "int32", 1, access="w")[0] = value
    ctx.printf("Source data: %d\\n", value)


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
    device_write, ret = acl.rt.binary_get_function(binary, "device_write")
    check(ret, "acl.rt.binary_get_function")
    device_read, ret = acl.rt.binary_get_function(binary, "device_read")
    check(ret, "acl.rt.binary_get_function")

    src, ret = acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    print(f"[INFO]  device block A at {src:#x} allocated")
    dst, ret = acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    print(f"[INFO]  device block B at {dst:#x} allocated")

    launch(device_write, stream, "<Qi", src, VALUE)
    print(f"[INFO]  kernel writing {VALUE} at {src:#x} queued")

    ret = acl.rt.memcpy_async(dst, SIZE, src, SIZE, acl.ACL_MEMCPY_DEVICE_TO_DEVICE, stream)
    check(ret, "acl.rt.memcpy_async")
    print(f"[INFO]  copy {src:#x} -> {dst:#x} queued")

    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    launch(device_read, stream, "<Q", dst)

    # simnpu prints what kernels printed when the program synchronizes (docs/acl.md)
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    read = read_back(dst)

    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.free(src), "acl.rt.free")
    check(acl.rt.free(dst), "acl.rt.free")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")
    check(acl.rt.reset_device_force(device_id), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    if read != VALUE:
        print(f"[ERROR] destination holds {read}, expected {VALUE}")
        sys.exit(1)


if __name__ == "__main__":
    main()
