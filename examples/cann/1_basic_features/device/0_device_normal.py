"""Follows the CANN runtime's example/1_basic_features/device/0_device_normal.

One device, start to end: aclInit, aclrtSetDevice, a stream, three device buffers
filled from the host, an addition run on the stream and waited for, the result copied
back and printed, then aclrtSynchronizeDevice and every resource released in turn, the
device with aclrtResetDeviceForce.

The vendor program runs the operator library's aclnnAdd (out = self + alpha * other on
4x2 float tensors, alpha 1.2). simnpu has no operator library; its built-in kernels do
the same arithmetic on the stream: `fill_f32` puts alpha in a workspace buffer (the
part aclnnAddGetWorkspaceSize sizes), `mul_f32` scales `other` by it there, and
`add_f32` adds `self`.

Run: python examples/cann/1_basic_features/device/0_device_normal.py
"""

import ctypes
import struct
import sys

import numpy as np

import acl

DEVICE_ID = 0
SHAPE = (4, 2)
SELF_DATA = [0, 1, 2, 3, 4, 5, 6, 7]
OTHER_DATA = [1, 1, 1, 2, 2, 2, 3, 3]
ALPHA = 1.2


class Failed(Exception):
    """A call returned an error code; the message names it."""


def check(ret: int, call: str) -> None:
    if ret != acl.ACL_SUCCESS:
        raise Failed(f"{call} returned error code {ret}: {acl.get_recent_err_msg()}")


def to_device(values: np.ndarray) -> int:
    """aclrtMalloc a buffer of the array's size and copy the array into it."""
    data = values.tobytes()
    dev, ret = acl.rt.malloc(len(data), acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    ret = acl.rt.memcpy(
        dev, len(data), acl.util.bytes_to_ptr(data), len(data), acl.ACL_MEMCPY_HOST_TO_DEVICE
    )
    check(ret, "acl.rt.memcpy")
    return dev


def launch(name: str, fmt: str, *args: object, stream: int) -> None:
    """Launch the built-in kernel `name` on one block with its packed arguments."""
    func, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, name)
    check(ret, "acl.rt.binary_get_function")
    packed = struct.pack(fmt, *args)
    ret = acl.rt.launch_kernel_with_host_args(
        func, 1, stream, None, acl.util.bytes_to_ptr(packed), len(packed)
    )
    check(ret, f"acl.rt.launch_kernel_with_host_args({name})")


def add(self_dev: int, other_dev: int, out_dev: int, count: int, stream: int) -> int:
    """out = self + ALPHA * other on the stream; returns the workspace to free afterwards."""
    workspace_size = count * 4  # one float per element: ALPHA * other
    workspace, ret = acl.rt.malloc(workspace_size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc (workspace)")
    launch("fill_f32", "<QfI", workspace, ALPHA, count, stream=stream)
    launch("mul_f32", "<QQQI", other_dev, workspace, workspace, count, stream=stream)
    launch("add_f32", "<QQQI", self_dev, workspace, out_dev, count, stream=stream)
    return workspace


def main() -> int:
    print("[INFO]  device_normal: starting.")
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")

    count = SHAPE[0] * SHAPE[1]
    self_dev = to_device(np.array(SELF_DATA, np.float32))
    other_dev = to_device(np.array(OTHER_DATA, np.float32))
    out_dev = to_device(np.zeros(count, np.float32))

    workspace = add(self_dev, other_dev, out_dev, count, stream)
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")

    result = (ctypes.c_float * count)()
    ret = acl.rt.memcpy(
        ctypes.addressof(result), count * 4, out_dev, count * 4, acl.ACL_MEMCPY_DEVICE_TO_HOST
    )
    check(ret, "acl.rt.memcpy")
    for index, value in enumerate(result):
        print(f"[INFO]  result[{index}] is: {value:f}")
    check(acl.rt.synchronize_device(), "acl.rt.synchronize_device")

    for dev in (self_dev, other_dev, out_dev, workspace):
        check(acl.rt.free(dev), "acl.rt.free")
    check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")

    expected = np.float32(SELF_DATA) + np.float32(ALPHA) * np.float32(OTHER_DATA)
    if list(result) != expected.tolist():
        print(f"[ERROR]  wrong sums: {list(result)}, expected {expected.tolist()}")
        return 1
    print("[INFO]  device_normal: every sum is self + 1.2 * other; done.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as failure:
        print(f"[ERROR]  {failure}")
        sys.exit(1)
