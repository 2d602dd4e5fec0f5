"""Follows the CANN runtime's example/2_advanced_features/kernel/0_launch_kernel: an Add
kernel loaded from a kernel file (acl.rt.binary_load_from_file, binary_get_function), its
arguments built with the runtime's kernel-args handle (kernel_args_init, kernel_args_append
and, in the place-holder mode, kernel_args_append_place_holder and
kernel_args_get_place_holder_buffer, then kernel_args_finalize) and launched with
acl.rt.launch_kernel_with_config; the float16 sum is checked against numpy's.

Run it with `simple` (the default: the kernel takes x, y and z) or `placeholder` (the
kernel also takes the total length and the tile count, whose data the launch carries to the
device). The vendor's build step writes the two kernel binaries; this program writes its
two Python kernel modules to a temporary folder instead."""

import ctypes
import os
import sys
import tempfile

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
DEVICE_ID = 0
BLOCK_DIM = 8
TOTAL_LENGTH = 8 * 2048
TILE_NUM = 8
BYTE_SIZE = TOTAL_LENGTH * 2  # float16
RELATIVE_TOL, ABSOLUTE_TOL, ERROR_TOL = 1e-3, 1e-5, 1e-3

# The Add kernel: each of the 8 cores adds its eighth of x and y into z, a tile at a time
# (two tiles per pass, as the Ascend C kernel's double buffering does).
ADD_BODY = """
def add_tiles(ctx, x, y, z, total_length, tile_num):
    block_length = total_length // 8
    if tile_num == 0:
        return
    tile_length = block_length // tile_num // 2
    first = block_length * ctx.block_idx
    for progress in range(tile_num * 2):
        start = 2 * (first + progress * tile_length)
        np.add(
            ctx.gm(x + start, "float16", tile_length, access="r"),
            ctx.gm(y + start, "float16", tile_length, access="r"),
            out=ctx.gm(z + start, "float16", tile_length),
        )
"""

KERNEL_MODULES = {
    "simple": f"""
import numpy as np

from simnpu import kernel
{ADD_BODY}

@kernel("ptr", "ptr", "ptr")
def add_custom(ctx, x, y, z):
    add_tiles(ctx, x, y, z, {TOTAL_LENGTH}, {TILE_NUM})
""",
    "placeholder": f"""
import numpy as np

from simnpu import kernel
{ADD_BODY}

@kernel("ptr", "ptr", "ptr", "ptr", "ptr")
def add_custom(ctx, x, y, z, tiling_length, tiling_num):
    total_length = int(ctx.gm(tiling_length, "int32", 1, access="r")[0])
    tile_num = int(ctx.gm(tiling_num, "int32", 1, access="r")[0])
    add_tiles(ctx, x, y, z, total_length, tile_num)
""",
}


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


def allocate(state):
    """Host and device buffers for x, y and z."""
    for name in ("x_host", "y_host", "z_host"):
        ptr, ret = acl.rt.malloc_host(BYTE_SIZE)
        check(ret, "acl.rt.malloc_host")
        state[name] = ptr
    for name in ("x_device", "y_device", "z_device"):
        ptr, ret = acl.rt.malloc(BYTE_SIZE, ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "acl.rt.malloc")
        state[name] = ptr


def prepare_inputs(state, x, y):
    """x and y into their host buffers, then onto the device."""
    for data, name in ((x, "x"), (y, "y")):
        ctypes.memmove(state[f"{name}_host"], data.ctypes.data, BYTE_SIZE)
        ret = acl.rt.memcpy(
            state[f"{name}_device"],
            BYTE_SIZE,
            state[f"{name}_host"],
            BYTE_SIZE,
            ACL_MEMCPY_HOST_TO_DEVICE,
        )
        check(ret, "acl.rt.memcpy")


def append_pointer(args, address):
    box = ctypes.c_uint64(address)
    _, ret = acl.rt.kernel_args_append(args, ctypes.addressof(box), ctypes.sizeof(box))
    check(ret, "acl.rt.kernel_args_append")


def place_int32(args, value):
    """A place-holder parameter whose 4 bytes of data hold `value`."""
    param, ret = acl.rt.kernel_args_append_place_holder(args)
    check(ret, "acl.rt.kernel_args_append_place_holder")
    return param, value


def build_args(state, mode, folder):
    """Loads the mode's kernel file and builds the launch's arguments."""
    path = os.path.join(folder, f"ascendc_kernels_{mode}.py")
    binary, ret = acl.rt.binary_load_from_file(path, None)
    check(ret, "acl.rt.binary_load_from_file")
    state["binary"] = binary
    func, ret = acl.rt.binary_get_function(binary, "add_custom")
    check(ret, "acl.rt.binary_get_function")
    args, ret = acl.rt.kernel_args_init(func)
    check(ret, "acl.rt.kernel_args_init")
    for name in ("x_device", "y_device", "z_device"):
        append_pointer(args, state[name])
    if mode == "placeholder":
        placed = [place_int32(args, TOTAL_LENGTH), place_int32(args, TILE_NUM)]
        for param, value in placed:
            size = ctypes.sizeof(ctypes.c_int32)
            buffer, ret = acl.rt.kernel_args_get_place_holder_buffer(args, param, size)
            check(ret, "acl.rt.kernel_args_get_place_holder_buffer")
            ctypes.c_int32.from_address(buffer).value = value
    check(acl.rt.kernel_args_finalize(args), "acl.rt.kernel_args_finalize")
    return func, args


def launch(state, func, args):
    """Launches the kernel, waits for it and returns z."""
    stream = state["stream"]
    ret = acl.rt.launch_kernel_with_config(func, BLOCK_DIM, stream, None, args, 0)
    check(ret, "acl.rt.launch_kernel_with_config")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    ret = acl.rt.memcpy(
        state["z_host"], BYTE_SIZE, state["z_device"], BYTE_SIZE, ACL_MEMCPY_DEVICE_TO_HOST
    )
    check(ret, "acl.rt.memcpy")
    return np.frombuffer(ctypes.string_at(state["z_host"], BYTE_SIZE), np.float16).copy()


def run(state, mode, x, y, folder):
    """The sample's steps; `state` records what the cleanup has to release."""
    check(acl.init(), "acl.init")
    state["initialized"] = True
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    state["device"] = True
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    state["stream"] = stream
    allocate(state)
    prepare_inputs(state, x, y)
    func, args = build_args(state, mode, folder)
    z = launch(state, func, args)
    info(f"Kernel launch sample runs in {mode} mode.")
    return z


def clean_up(state):
    """Releases what `run` made, in the sample's order; False when a call failed."""
    steps = []
    if "binary" in state:
        steps.append(("acl.rt.binary_unload", acl.rt.binary_unload, state["binary"]))
    for name in ("z_device", "y_device", "x_device"):
        if name in state:
            steps.append(("acl.rt.free", acl.rt.free, state[name]))
    for name in ("z_host", "y_host", "x_host"):
        if name in state:
            steps.append(("acl.rt.free_host", acl.rt.free_host, state[name]))
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
    if state.get("initialized"):
        ret = acl.finalize()
        if ret != ACL_SUCCESS:
            error(f"acl.finalize failed with error code {ret}")
            ok = False
    return ok


def verify(z, golden):
    """The vendor's check: at most 0.1% of the elements off by more than the tolerance."""
    close = np.isclose(z, golden, rtol=RELATIVE_TOL, atol=ABSOLUTE_TOL, equal_nan=True)
    wrong = np.flatnonzero(~close)
    for index in wrong[:101]:
        expected, actual = float(golden[index]), float(z[index])
        print(f"data index: {index:06d}, expected: {expected:.9f}, actual: {actual:.9f}")
    ratio = wrong.size / golden.size
    print(f"error ratio: {ratio:.4f}, tolerance: {ERROR_TOL:.4f}")
    return ratio <= ERROR_TOL


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "simple"
    if mode not in KERNEL_MODULES:
        error(f"Unknown run mode {mode}: use simple or placeholder.")
        return 1
    x = np.random.uniform(1, 100, [8, 2048]).astype(np.float16)
    y = np.random.uniform(1, 100, [8, 2048]).astype(np.float16)
    golden = (x + y).astype(np.float16).reshape(-1)

    state = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, source in KERNEL_MODULES.items():
            with open(os.path.join(folder, f"ascendc_kernels_{name}.py"), "w") as module:
                module.write(source)
        try:
            z = run(state, mode, x, y, folder)
        except Failed:
            z = None
    if not clean_up(state) or z is None:
        return 1
    info("Run the launch_kernel sample successfully.")
    if not verify(z, golden):
        print("[FAILURE] result error")
        return 1
    print("[SUCCESS] result correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
