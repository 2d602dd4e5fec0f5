"""A pyACL program written for simnpu's tests against the pyACL documentation: load a
kernel binary from a file, look up its function, put the packed argument struct in device
memory and launch it with acl.rt.launch_kernel (aclrtLaunchKernel)."""

import os
import struct

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
N = 10000
BLOCKS = 8


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception("{} failed ret={}".format(message, ret))


def to_device(data):
    ptr, ret = acl.rt.malloc(len(data), 0)
    check_ret("acl.rt.malloc", ret)
    check_ret(
        "acl.rt.memcpy",
        acl.rt.memcpy(
            ptr, len(data), acl.util.bytes_to_ptr(data), len(data), ACL_MEMCPY_HOST_TO_DEVICE
        ),
    )
    return ptr


def main():
    check_ret("acl.init", acl.init())
    check_ret("acl.rt.set_device", acl.rt.set_device(0))
    stream, ret = acl.rt.create_stream()
    check_ret("acl.rt.create_stream", ret)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "vadd.py")
    binary, ret = acl.rt.binary_load_from_file(path, [])
    check_ret("acl.rt.binary_load_from_file", ret)
    func, ret = acl.rt.binary_get_function(binary, "vadd")
    check_ret("acl.rt.binary_get_function", ret)

    x = np.random.rand(N).astype(np.float32)
    y = np.random.rand(N).astype(np.float32)
    dev_x, dev_y = to_device(x.tobytes()), to_device(y.tobytes())
    dev_z, ret = acl.rt.malloc(N * 4, 0)
    check_ret("acl.rt.malloc", ret)
    args = struct.pack("<QQQI", dev_x, dev_y, dev_z, N)
    dev_args = to_device(args)
    check_ret(
        "acl.rt.launch_kernel", acl.rt.launch_kernel(func, BLOCKS, dev_args, len(args), stream)
    )
    check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(stream))

    out = bytes(N * 4)
    check_ret(
        "acl.rt.memcpy",
        acl.rt.memcpy(acl.util.bytes_to_ptr(out), N * 4, dev_z, N * 4, ACL_MEMCPY_DEVICE_TO_HOST),
    )
    z = np.frombuffer(out, np.float32)
    print("[INFO] z[:3] = {} (x + y = {})".format(z[:3], (x + y)[:3]))
    if not np.allclose(z, x + y):
        raise Exception("wrong result")

    for ptr in (dev_x, dev_y, dev_z, dev_args):
        check_ret("acl.rt.free", acl.rt.free(ptr))
    check_ret("acl.rt.binary_unload", acl.rt.binary_unload(binary))
    check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(stream))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(0))
    check_ret("acl.finalize", acl.finalize())
    print("run success")


if __name__ == "__main__":
    main()
