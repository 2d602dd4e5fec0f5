"""After the CANN runtime's example/0_quickstart/4_custom_kernel_launch: the same vector
addition as 0_hello_cann, dst = srcA + alpha * srcB over 8 floats, done by a custom
kernel of the program's own instead of an operator library.

The vendor example writes an Ascend C kernel and launches it with the <<<blockDim, l2ctrl,
stream>>> operator on one block. simnpu's kernels are Python: the kernel below is loaded
with acl.rt.binary_load_from_data and launched on one block with
acl.rt.launch_kernel_with_host_args, its parameters packed as the kernel's C struct (the
<<<>>> call does that packing for an Ascend C kernel).
"""

import ctypes
import struct
import sys

import acl

DEVICE_ID = 0
BLOCK_DIM = 1
COUNT = 8
ALPHA = 1.0
TOLERANCE = 1e-5
SRC_A = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
SRC_B = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]

VECTOR_ADD = """
from simnpu import kernel


@kernel("ptr", "ptr", "ptr", "f32", "u32")
def vector_add(ctx, src_a, src_b, dst, alpha, count):
    a = ctx.gm(src_a, "float32", count, access="r")
    b = ctx.gm(src_b, "float32", count, access="r")
    out = ctx.gm(dst, "float32", count)
    for i in range(count):  # one block walks every element, as the vendor kernel does
        out[i] = a[i] + alpha * b[i]
"""


def check(ret, call):
    """Stop the program (status 1) when an acl call did not succeed."""
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {call} failed with ret = {ret} ({acl.get_recent_err_msg()})")
        sys.exit(1)


def vector_add_do(func, block_dim, stream, src_a, src_b, dst, alpha, count):
    """The kernel call: the parameters as the kernel's struct, launched on `stream` (async)."""
    args = struct.pack("<QQQfI", src_a, src_b, dst, alpha, count)
    return acl.rt.launch_kernel_with_host_args(
        func, block_dim, stream, None, acl.util.bytes_to_ptr(args), len(args)
    )


def show(name, values):
    print(f"  {name + ':':8}[{', '.join(f'{v:.1f}' for v in values)}]")


def main():
    size = COUNT * 4
    check(acl.init(), "acl.init")
    print("acl.init done")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    print(f"device {DEVICE_ID} set")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    print("stream created")

    buffers = []
    for _ in range(3):
        addr, ret = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "acl.rt.malloc")
        buffers.append(addr)
    src_a, src_b, dst = buffers
    print("device buffers allocated")
    for addr, values in ((src_a, SRC_A), (src_b, SRC_B)):
        data = struct.pack(f"<{COUNT}f", *values)
        check(
            acl.rt.memcpy(
                addr, size, acl.util.bytes_to_ptr(data), size, acl.ACL_MEMCPY_HOST_TO_DEVICE
            ),
            "acl.rt.memcpy",
        )
    print("inputs copied to the device")
    print("inputs:")
    show("self", SRC_A)
    show("other", SRC_B)
    print(f"  alpha:  {ALPHA:.1f}")

    binary, ret = acl.rt.binary_load_from_data(VECTOR_ADD, None)
    check(ret, "acl.rt.binary_load_from_data")
    func, ret = acl.rt.binary_get_function(binary, "vector_add")
    check(ret, "acl.rt.binary_get_function")
    check(
        vector_add_do(func, BLOCK_DIM, stream, src_a, src_b, dst, ALPHA, COUNT),
        "acl.rt.launch_kernel_with_host_args",
    )
    print("custom kernel launched")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    print("stream synchronized")

    result = (ctypes.c_float * COUNT)()
    check(
        acl.rt.memcpy(ctypes.addressof(result), size, dst, size, acl.ACL_MEMCPY_DEVICE_TO_HOST),
        "acl.rt.memcpy",
    )
    print()
    print("out = self + alpha * other:")
    matched = True
    for i, value in enumerate(result):
        expected = SRC_A[i] + ALPHA * SRC_B[i]
        print(f"  result[{i}] = {value:.1f} (expected {expected:.1f})")
        if abs(value - expected) > TOLERANCE:
            matched = False

    for addr in buffers:
        check(acl.rt.free(addr), "acl.rt.free")
    print("device memory freed")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")
    check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")
    print("stream destroyed")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    print("device reset")
    check(acl.finalize(), "acl.finalize")
    print("acl.finalize done")

    if not matched:
        print("\n[ERROR] the custom kernel's results differ from self + alpha * other")
        sys.exit(1)
    print("\ncustom_kernel_launch: all results match")


if __name__ == "__main__":
    main()
