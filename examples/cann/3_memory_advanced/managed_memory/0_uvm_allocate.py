"""Follows the CANN runtime's example/3_memory_advanced/managed_memory/0_uvm_allocate: the
inputs and the output of an Add kernel are managed (unified) memory
(acl.rt.mem_alloc_managed with ACL_RT_MEM_ATTACH_GLOBAL); the inputs are written at their
pointers on the host, the same pointers are the kernel's arguments (kernel_args_init,
kernel_args_append, kernel_args_finalize, launch_kernel_with_config on 8 cores), and the
sum is read at the output's pointer after the stream's synchronize -- no copy anywhere.
The memory is freed with acl.rt.free. Where managed memory is not supported
(mem_alloc_managed returns 207000) the program says it skips and exits 0, as the vendor's
does. The vendor's scripts generate random float16 inputs and compare the output with
numpy's sum; this program does both itself, and writes its Python kernel module to a
temporary folder instead of building an Ascend C binary."""

import ctypes
import os
import sys
import tempfile

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
ACL_RT_MEM_ATTACH_GLOBAL = 0x1
DEVICE_ID = 0
BLOCK_DIM = 8
COUNT = 8 * 2048
BYTE_SIZE = COUNT * 2  # float16
RELATIVE_TOL, ABSOLUTE_TOL, ERROR_TOL = 1e-3, 1e-5, 1e-3

KERNEL = f"""
import numpy as np

from simnpu import kernel


@kernel("ptr", "ptr", "ptr")
def add_custom(ctx, x, y, z):
    share = {COUNT} // ctx.block_num
    offset = 2 * share * ctx.block_idx
    np.add(
        ctx.gm(x + offset, "float16", share, access="r"),
        ctx.gm(y + offset, "float16", share, access="r"),
        out=ctx.gm(z + offset, "float16", share, access="w"),
    )
"""


class Failed(Exception):
    """A call returned an error: the program cleans up and exits 1."""


class Skipped(Exception):
    """Managed memory is not supported here."""


def info(text):
    print(f"[INFO]  {text}")


def error(text):
    print(f"[ERROR]  {text}")


def check(ret, what):
    if ret != ACL_SUCCESS:
        error(f"{what} failed with error code {ret}")
        raise Failed(what)


def at(ptr):
    """The float16 elements at host pointer `ptr`, in place."""
    return np.frombuffer((ctypes.c_uint16 * COUNT).from_address(ptr), np.float16)


def run(state, x, y, folder):
    check(acl.init(), "acl.init")
    state["initialized"] = True
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    state["device"] = True
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    state["stream"] = stream
    for name in ("x", "y", "z"):
        ptr, ret = acl.rt.mem_alloc_managed(BYTE_SIZE, ACL_RT_MEM_ATTACH_GLOBAL)
        if ret == ACL_ERROR_RT_FEATURE_NOT_SUPPORT and name == "x":
            info(
                f"[SKIP] the uvm_allocate sample is skipped: {acl.get_soc_name()} does not "
                f"support managed memory (mem_alloc_managed returned {ret})."
            )
            raise Skipped
        check(ret, "acl.rt.mem_alloc_managed")
        state[name] = ptr
    at(state["x"])[:] = x  # the inputs, written where the kernel reads them
    at(state["y"])[:] = y

    path = os.path.join(folder, "ascendc_kernels_simple.py")
    binary, ret = acl.rt.binary_load_from_file(path, None)
    check(ret, "acl.rt.binary_load_from_file")
    state["binary"] = binary
    func, ret = acl.rt.binary_get_function(binary, "add_custom")
    check(ret, "acl.rt.binary_get_function")
    args, ret = acl.rt.kernel_args_init(func)
    check(ret, "acl.rt.kernel_args_init")
    for name in ("x", "y", "z"):
        box = ctypes.c_uint64(state[name])
        _, ret = acl.rt.kernel_args_append(args, ctypes.addressof(box), ctypes.sizeof(box))
        check(ret, "acl.rt.kernel_args_append")
    check(acl.rt.kernel_args_finalize(args), "acl.rt.kernel_args_finalize")
    check(
        acl.rt.launch_kernel_with_config(func, BLOCK_DIM, stream, None, args, 0),
        "acl.rt.launch_kernel_with_config",
    )
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    return at(state["z"]).copy()


def clean_up(state):
    steps = []
    if "binary" in state:
        steps.append(("acl.rt.binary_unload", acl.rt.binary_unload, state["binary"]))
    for name in ("z", "y", "x"):
        if name in state:
            steps.append(("acl.rt.free", acl.rt.free, state[name]))
    if "stream" in state:
        steps.append(("acl.rt.destroy_stream_force", acl.rt.destroy_stream_force, state["stream"]))
    if state.get("device"):
        steps.append(("acl.rt.reset_device_force", acl.rt.reset_device_force, DEVICE_ID))
    ok = True
    for what, call, argument in steps:
        ret = call(argument)
        if ret != ACL_SUCCESS:
            error(f"{what} failed with error code {ret}")
            ok = False
    if state.get("initialized") and acl.finalize() != ACL_SUCCESS:
        error("acl.finalize failed")
        ok = False
    return ok


def main():
    x = np.random.uniform(1, 100, [8, 2048]).astype(np.float16).reshape(-1)
    y = np.random.uniform(1, 100, [8, 2048]).astype(np.float16).reshape(-1)
    golden = (x + y).astype(np.float16)
    state = {}
    z = None
    skipped = False
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "ascendc_kernels_simple.py"), "w") as module:
            module.write(KERNEL)
        try:
            z = run(state, x, y, folder)
        except Skipped:
            skipped = True
        except Failed:
            pass
    if not clean_up(state):
        return 1
    if skipped:
        print("[SUCCESS] the uvm_allocate sample was skipped: managed memory is not supported.")
        return 0
    if z is None:
        return 1
    info("The uvm_allocate sample ran successfully.")
    close = np.isclose(z, golden, rtol=RELATIVE_TOL, atol=ABSOLUTE_TOL, equal_nan=True)
    wrong = np.flatnonzero(~close)
    for index in wrong[:101]:
        expected, actual = float(golden[index]), float(z[index])
        print(f"data index: {index:06d}, expected: {expected:.9f}, actual: {actual:.9f}")
    ratio = wrong.size / golden.size
    print(f"error ratio: {ratio:.4f}, tolerance: {ERROR_TOL:.4f}")
    if ratio > ERROR_TOL:
        print("[FAILURE] result error")
        return 1
    print("[SUCCESS] result correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
