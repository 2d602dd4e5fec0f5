"""Follows the CANN runtime's example/3_memory_advanced/host_register/0_simple_zero_copy:
three buffers of pinned host memory (acl.rt.malloc_host) are registered for device access
(host_register_v2 with ACL_HOST_REG_MAPPED) and their device addresses taken
(host_get_device_pointer); an Add kernel, its arguments built with the kernel-args handle
and launched with launch_kernel_with_config on 8 cores, reads the two float16 inputs and
writes the sum straight into the host output buffer. All 16384 results are checked in host
memory after the stream's synchronize, with no copy. The vendor's build writes an Ascend C
kernel binary; this program writes a Python kernel module to a temporary folder instead."""

import ctypes
import os
import sys
import tempfile

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_HOST_REG_MAPPED = 0x2
DEVICE_ID = 0
BLOCK_DIM = 8
COUNT = 8 * 2048
BYTE_SIZE = COUNT * 2  # float16
ONE, TWO, THREE = 0x3C00, 0x4000, 0x4200  # float16 bit patterns

KERNEL = f"""
from simnpu import kernel


@kernel("ptr", "ptr", "ptr")
def add_custom(ctx, x, y, z):
    share = {COUNT} // ctx.block_num
    offset = 2 * share * ctx.block_idx
    out = ctx.gm(z + offset, "float16", share, access="w")
    out[:] = ctx.gm(x + offset, "float16", share, access="r") + ctx.gm(
        y + offset, "float16", share, access="r"
    )
"""


class Failed(Exception):
    """A call returned an error: the program cleans up and exits 1."""


def info(text):
    print(f"[INFO]  {text}")


def error(text):
    print(f"[ERROR]  {text}")


def check(ret, what):
    if ret != ACL_SUCCESS:
        error(f"{what} failed with error code {ret}")
        raise Failed(what)


def halves(ptr):
    """The buffer at `ptr` as float16 bit patterns, in place."""
    return np.frombuffer((ctypes.c_uint16 * COUNT).from_address(ptr), np.uint16)


def mapped_buffer(state, name):
    host, ret = acl.rt.malloc_host(BYTE_SIZE)
    check(ret, "acl.rt.malloc_host")
    state[f"{name}_host"] = host
    check(acl.rt.host_register_v2(host, BYTE_SIZE, ACL_HOST_REG_MAPPED), "acl.rt.host_register_v2")
    state[f"{name}_registered"] = True
    device, ret = acl.rt.host_get_device_pointer(host, 0)
    check(ret, "acl.rt.host_get_device_pointer")
    if not device:
        error("The device address of the mapped buffer is null.")
        raise Failed("acl.rt.host_get_device_pointer")
    state[f"{name}_device"] = device


def run(state, folder):
    check(acl.init(), "acl.init")
    state["initialized"] = True
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    state["device"] = True
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    state["stream"] = stream
    for name in ("a", "b", "out"):
        mapped_buffer(state, name)
    halves(state["a_host"])[:] = ONE
    halves(state["b_host"])[:] = TWO
    halves(state["out_host"])[:] = 0
    info("Three host buffers are registered and have device addresses.")

    path = os.path.join(folder, "simple_zero_copy_kernel.py")
    binary, ret = acl.rt.binary_load_from_file(path, None)
    check(ret, "acl.rt.binary_load_from_file")
    state["binary"] = binary
    func, ret = acl.rt.binary_get_function(binary, "add_custom")
    check(ret, "acl.rt.binary_get_function")
    args, ret = acl.rt.kernel_args_init(func)
    check(ret, "acl.rt.kernel_args_init")
    for name in ("a", "b", "out"):
        box = ctypes.c_uint64(state[f"{name}_device"])
        _, ret = acl.rt.kernel_args_append(args, ctypes.addressof(box), ctypes.sizeof(box))
        check(ret, "acl.rt.kernel_args_append")
    check(acl.rt.kernel_args_finalize(args), "acl.rt.kernel_args_finalize")
    check(
        acl.rt.launch_kernel_with_config(func, BLOCK_DIM, stream, None, args, 0),
        "acl.rt.launch_kernel_with_config",
    )
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    out = halves(state["out_host"])
    wrong = np.flatnonzero(out != THREE)
    if wrong.size:
        index = int(wrong[0])
        error(f"Element {index} is 0x{int(out[index]):04x}, expected 0x{THREE:04x}")
        raise Failed("verification")
    info(f"All {COUNT} float16 sums are right, read in the mapped host memory.")


def clean_up(state):
    """Releases what `run` made, in the sample's order; False when a call failed."""
    steps = []
    if "binary" in state:
        steps.append(("acl.rt.binary_unload", acl.rt.binary_unload, state["binary"]))
    for name in ("out", "b", "a"):
        if state.get(f"{name}_registered"):
            steps.append(("acl.rt.host_unregister", acl.rt.host_unregister, state[f"{name}_host"]))
        if f"{name}_host" in state:
            steps.append(("acl.rt.free_host", acl.rt.free_host, state[f"{name}_host"]))
    if "stream" in state:
        steps.append(("acl.rt.destroy_stream", acl.rt.destroy_stream, state["stream"]))
    if state.get("device"):
        steps.append(("acl.rt.reset_device_force", acl.rt.reset_device_force, DEVICE_ID))
    ok = True
    for what, call, argument in steps:
        ret = call(argument)
        if ret != ACL_SUCCESS:
            error(f"cleanup: {what} failed with error code {ret}")
            ok = False
    if state.get("initialized") and acl.finalize() != ACL_SUCCESS:
        error("cleanup: acl.finalize failed")
        ok = False
    return ok


def main():
    info("Start the simple_zero_copy sample.")
    state = {}
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "simple_zero_copy_kernel.py"), "w") as module:
            module.write(KERNEL)
        try:
            run(state, folder)
            passed = True
        except Failed:
            passed = False
    if not clean_up(state) or not passed:
        error("The simple_zero_copy sample failed.")
        return 1
    info("The simple_zero_copy sample ran successfully.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
