"""Follows the CANN runtime's example/2_advanced_features/callback/1_callback_hostfunc.

A host function queued on a stream with aclrtLaunchHostFunc: it runs once the tasks
queued before it have completed, and the tasks queued after it wait for it. No thread of
the program has to serve it (no subscription): the runtime runs it. The stream stops at
the first failure (aclrtSetStreamFailureMode, ACL_STOP_ON_FAILURE). A one-block kernel
adds 1 to a counter in device memory, the host function prints a line, and after
aclrtSynchronizeStream the counter is read back: 1. The stream goes with
aclrtDestroyStreamForce, then the context and the device.

The vendor's Ascend C kernel `EasyOPf` (each block adds 1 to its own counter) is the
Python kernel `easy_op` below.

Run: python examples/cann/2_advanced_features/callback/1_callback_hostfunc.py
"""

import ctypes
import struct
import sys

import acl

DEVICE_ID = 0
BLOCKS = 1

KERNEL_SOURCE = """
from simnpu import kernel


@kernel("ptr")
def easy_op(ctx, x):
    counter = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    counter += 1
"""


class Failed(Exception):
    """A call returned an error code; the message names it."""


def check(ret: int, call: str) -> None:
    if ret != acl.ACL_SUCCESS:
        raise Failed(f"{call} returned error code {ret}: {acl.get_recent_err_msg()}")


def host_function(user_data: list[str]) -> None:
    """Queued with launch_host_func: runs on the runtime's thread in stream order."""
    print("[INFO]  The host function runs.")
    user_data.append("ran")


def main() -> int:
    num = ctypes.c_uint32(0)
    size = ctypes.sizeof(num)
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    context, ret = acl.rt.create_context(DEVICE_ID)
    check(ret, "acl.rt.create_context")
    num_device, ret = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    ret = acl.rt.memcpy(
        num_device, size, ctypes.addressof(num), size, acl.ACL_MEMCPY_HOST_TO_DEVICE
    )
    check(ret, "acl.rt.memcpy")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    ret = acl.rt.set_stream_failure_mode(stream, acl.ACL_STOP_ON_FAILURE)
    check(ret, "acl.rt.set_stream_failure_mode")

    binary, ret = acl.rt.binary_load_from_data(KERNEL_SOURCE)
    check(ret, "acl.rt.binary_load_from_data")
    easy_op, ret = acl.rt.binary_get_function(binary, "easy_op")
    check(ret, "acl.rt.binary_get_function")
    args = struct.pack("<Q", num_device)
    ret = acl.rt.launch_kernel_with_host_args(
        easy_op, BLOCKS, stream, None, acl.util.bytes_to_ptr(args), len(args)
    )
    check(ret, "acl.rt.launch_kernel_with_host_args")
    runs: list[str] = []
    check(acl.rt.launch_host_func(stream, host_function, runs), "acl.rt.launch_host_func")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    ret = acl.rt.memcpy(
        ctypes.addressof(num), size, num_device, size, acl.ACL_MEMCPY_DEVICE_TO_HOST
    )
    check(ret, "acl.rt.memcpy")
    print(f"[INFO]  After the stream's tasks the counter is: {num.value}.")

    check(acl.rt.free(num_device), "acl.rt.free")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")
    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    acl.finalize()
    print("[INFO]  Resources released.")
    if runs != ["ran"] or num.value != 1:
        print(f"[ERROR]  expected one host function run and counter 1: {runs}, {num.value}")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as failure:
        print(f"[ERROR]  {failure}")
        sys.exit(1)
