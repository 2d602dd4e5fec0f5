"""After the CANN runtime's example/1_basic_features/stream/1_stream_with_failure_mode.

A stream state callback announces streams being created and destroyed. Three one-block
kernels (add 1, fail, add 1) run twice on one stream: under the default failure mode
(continue on failure) both additions run and the word ends at 2; after
set_stream_failure_mode(ACL_STOP_ON_FAILURE) the failure stops everything after it and the
word ends at 1. Each synchronize reports the failing kernel's error. Then, on streams of
their own, a long kernel is stopped with stream_stop (on a device-use-only stream) and
aborted with stream_abort, and the synchronize after each is logged: the context stopped
on the failure, so each reports that failure again, which the example expects. Expected
results: 2, then 1.
"""

import struct
import sys

import acl

DEVICE = 0
TAG = "stream_failure_mode_sample"
KERNELS = """
import time
from simnpu import kernel

@kernel("ptr")
def add_one(ctx, x):
    word = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    word[0] += 1

@kernel()
def trap(ctx):
    raise RuntimeError("this kernel fails on purpose")

@kernel("ptr")
def long_task(ctx, x):
    time.sleep(2.0)
    word = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    word[0] += 1
"""


def check(ret, call):
    if ret != 0:
        print(f"[ERROR]  {call} returned {ret}")
        sys.exit(1)


def report(ret, call):
    """A call whose failure the example expects: log it and go on."""
    level = "INFO" if ret == 0 else "WARN"
    print(f"[{level}]  {call} returned {ret}.")
    return ret


def on_stream_state(stream, state, args):
    print(f"[INFO]  Stream state callback ({args}): stream={stream:#x} state={state}")


class Kernels:
    def __init__(self):
        self.binary, ret = acl.rt.binary_load_from_data(KERNELS)
        check(ret, "acl.rt.binary_load_from_data")
        self.functions = {}
        for name in ("add_one", "trap", "long_task"):
            self.functions[name], ret = acl.rt.binary_get_function(self.binary, name)
            check(ret, "acl.rt.binary_get_function")

    def launch(self, name, stream, *pointers):
        args = struct.pack("<" + "Q" * len(pointers), *pointers)
        check(
            acl.rt.launch_kernel_with_host_args(
                self.functions[name], 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
            ),
            f"acl.rt.launch_kernel_with_host_args({name})",
        )


def write_word(ptr, value):
    host = struct.pack("<I", value)
    check(acl.rt.memcpy(ptr, 4, acl.util.bytes_to_ptr(host), 4, 1), "acl.rt.memcpy(H2D)")


def read_word(ptr):
    host = bytes(4)  # the copy fills this buffer in place, as pyACL does
    check(acl.rt.memcpy(acl.util.bytes_to_ptr(host), 4, ptr, 4, 2), "acl.rt.memcpy(D2H)")
    return struct.unpack("<I", host)[0]


def scratch():
    ptr, ret = acl.rt.malloc(4, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc(scratch)")
    write_word(ptr, 0)
    return ptr


def show_stop(kernels):
    stream, ret = acl.rt.create_stream_with_config(0, acl.ACL_STREAM_DEVICE_USE_ONLY)
    check(ret, "acl.rt.create_stream_with_config")
    word = scratch()
    print("[INFO]  A long task on the device-use-only stream, then stream_stop.")
    kernels.launch("long_task", stream, word)
    report(acl.rt.stream_stop(stream), "acl.rt.stream_stop")
    report(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream (after the stop)")
    report(acl.rt.free(word), "acl.rt.free(scratch)")
    report(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")


def show_abort(kernels):
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    word = scratch()
    print("[INFO]  A long task on a regular stream, then stream_abort.")
    kernels.launch("long_task", stream, word)
    report(acl.rt.stream_abort(stream), "acl.rt.stream_abort")
    ret = acl.rt.synchronize_stream(stream)
    if ret == 0:
        print("[INFO]  acl.rt.synchronize_stream (after the abort) returned 0.")
    else:
        print(
            f"[INFO]  acl.rt.synchronize_stream (after the abort) returned {ret}, as "
            "expected after an abort."
        )
    report(acl.rt.free(word), "acl.rt.free(scratch)")
    report(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")


def run_three(kernels, stream, word):
    kernels.launch("add_one", stream, word)
    kernels.launch("trap", stream)
    kernels.launch("add_one", stream, word)
    ret = acl.rt.synchronize_stream(stream)
    if ret != 0:
        print(f"[ERROR]  acl.rt.synchronize_stream returned {ret} (the failing kernel)")
    return ret


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.reg_stream_state_callback(TAG, on_stream_state, TAG), "reg_stream_state_callback")
    check(acl.rt.set_device(DEVICE), "acl.rt.set_device")
    context, ret = acl.rt.create_context(DEVICE)
    check(ret, "acl.rt.create_context")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    word, ret = acl.rt.malloc(4, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    write_word(word, 0)
    kernels = Kernels()

    print("[INFO]  Three tasks under the default failure mode.")
    first_sync = run_three(kernels, stream, word)
    continued = read_word(word)
    print(f"[INFO]  Continuing on failure, the result is {continued}.")

    write_word(word, 0)
    check(
        acl.rt.set_stream_failure_mode(stream, acl.ACL_STOP_ON_FAILURE), "set_stream_failure_mode"
    )
    print("[INFO]  Three tasks under ACL_STOP_ON_FAILURE.")
    second_sync = run_three(kernels, stream, word)
    stopped = read_word(word)
    print(f"[INFO]  Stopping on failure, the result is {stopped}.")

    show_stop(kernels)
    show_abort(kernels)

    check(acl.rt.free(word), "acl.rt.free")
    check(acl.rt.binary_unload(kernels.binary), "acl.rt.binary_unload")
    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reg_stream_state_callback(TAG, None, None), "reg_stream_state_callback(None)")
    check(acl.rt.reset_device_force(DEVICE), "acl.rt.reset_device_force")
    acl.finalize()
    print("[INFO]  Resources released.")

    if first_sync == 0 or second_sync == 0 or (continued, stopped) != (2, 1):
        print(
            f"[ERROR]  expected failing synchronizes and results 2, 1; got {continued}, {stopped}"
        )
        sys.exit(1)
    print("[INFO]  The stream_with_failure_mode program ran as expected.")


if __name__ == "__main__":
    main()
