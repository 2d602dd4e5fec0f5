"""Follows the CANN runtime's example/2_advanced_features/kernel/1_launch_kernel_with_reslimit:
this process limits its kernels to 8 cube cores of device 0 (acl.rt.set_device_res_limit,
ACL_RT_DEV_RES_CUBE_CORE), reads the limit back (get_device_res_limit) and launches a
kernel of that many blocks, each printing "Hello World" with the device printf
(ctx.printf); the lines reach this program's stdout when it synchronizes the stream.

The vendor's run script counts the "Hello World" lines of the program's output; this
program counts what it printed itself. The limit cannot exceed the device's AI cores: run
it on a daemon of at least 8 (`simnpu serve --ai-cores 8`; SIMNPU_AI_CORES=8 for the daemon
a program starts), else set_device_res_limit returns 107000."""

import io
import sys

import acl

ACL_SUCCESS = 0
ACL_RT_DEV_RES_CUBE_CORE = 0
DEVICE_ID = 0
BLOCK_DIM = 8
MESSAGE = "Hello World"

PRINT_KERNEL = """
from simnpu import kernel


@kernel()
def KernelPrint(ctx):
    ctx.printf("Hello World\\n")
"""


class Failed(Exception):
    """A call returned an error: the program cleans up and exits 1."""


class Tee(io.StringIO):
    """Keeps a copy of what is printed while it still reaches the terminal."""

    def __init__(self, terminal):
        super().__init__()
        self.terminal = terminal

    def write(self, text):
        self.terminal.write(text)
        return super().write(text)

    def flush(self):
        self.terminal.flush()


def info(text):
    print(f"[INFO]  {text}")


def error(text):
    print(f"[ERROR]  {text}")


def check(ret, what):
    if ret != ACL_SUCCESS:
        error(f"{what} failed with error code {ret}")
        raise Failed(what)


def print_do(block_dim, stream, state):
    """KernelPrint<<<block_dim, nullptr, stream>>>(): the print kernel, which takes no
    arguments, launched with an empty kernel-args handle."""
    binary, ret = acl.rt.binary_load_from_data(PRINT_KERNEL, None)
    check(ret, "acl.rt.binary_load_from_data")
    state["binary"] = binary
    func, ret = acl.rt.binary_get_function(binary, "KernelPrint")
    check(ret, "acl.rt.binary_get_function")
    args, ret = acl.rt.kernel_args_init(func)
    check(ret, "acl.rt.kernel_args_init")
    check(acl.rt.kernel_args_finalize(args), "acl.rt.kernel_args_finalize")
    ret = acl.rt.launch_kernel_with_config(func, block_dim, stream, None, args, 0)
    check(ret, "acl.rt.launch_kernel_with_config")


def run(state):
    """The sample's steps; `state` records what the cleanup has to release."""
    check(acl.init(), "acl.init")
    state["initialized"] = True
    info("ACL initialized.")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    state["device"] = True
    info(f"Device {DEVICE_ID} selected.")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    state["stream"] = stream
    info("Stream created.")

    ret = acl.rt.set_device_res_limit(DEVICE_ID, ACL_RT_DEV_RES_CUBE_CORE, BLOCK_DIM)
    check(ret, "acl.rt.set_device_res_limit")
    info(f"Device resource limit type {ACL_RT_DEV_RES_CUBE_CORE} set to {BLOCK_DIM}.")

    core_dim, ret = acl.rt.get_device_res_limit(DEVICE_ID, ACL_RT_DEV_RES_CUBE_CORE)
    check(ret, "acl.rt.get_device_res_limit")
    info(f"Current device resource limit type {ACL_RT_DEV_RES_CUBE_CORE} is {core_dim}.")
    print_do(core_dim, stream, state)
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")


def clean_up(state):
    """Releases what `run` made, in the sample's order; False when a call failed."""
    steps = []
    if "binary" in state:
        steps.append(("acl.rt.binary_unload", lambda: acl.rt.binary_unload(state["binary"])))
    if "stream" in state:
        steps.append(
            ("acl.rt.destroy_stream_force", lambda: acl.rt.destroy_stream_force(state["stream"]))
        )
    if state.get("device"):
        steps.append(("acl.rt.reset_device_force", lambda: acl.rt.reset_device_force(DEVICE_ID)))
    if state.get("initialized"):
        steps.append(("acl.finalize", acl.finalize))
    ok = True
    for what, step in steps:
        ret = step()
        if ret != ACL_SUCCESS:
            error(f"{what} failed with error code {ret}")
            ok = False
    return ok


def main():
    state = {}
    output = Tee(sys.stdout)
    sys.stdout = output
    try:
        run(state)
        ok = True
    except Failed:
        ok = False
    ok = clean_up(state) and ok
    sys.stdout = output.terminal
    if not ok:
        return 1
    info("Run the launch_kernel_with_reslimit sample successfully.")
    count = output.getvalue().splitlines().count(MESSAGE)
    if count != BLOCK_DIM:
        print(f"[FAILURE] Expected {BLOCK_DIM} lines of {MESSAGE}, found {count}.")
        return 1
    print("[SUCCESS] Launch kernels under resource limits successfully.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
