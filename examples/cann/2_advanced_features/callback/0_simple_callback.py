"""Follows the CANN runtime's example/2_advanced_features/callback/0_simple_callback.

Two kinds of host work queued on one stream, each served by a thread the program starts:
callbacks (aclrtLaunchCallback) run on the thread subscribed with aclrtSubscribeReport,
which loops on aclrtProcessReport; host functions (aclrtLaunchHostFunc) run on the thread
subscribed with aclrtSubscribeHostFunc, which loops on aclrtProcessHostFunc. Both threads
set the program's context first. On a stream that stops at the first failure the program
queues a callback, a long kernel that adds 1 to a counter, a host function, then five
more callbacks, all with the user data 520; each prints the thread it runs on. After
aclrtSynchronizeStream the counter is read back (1), the threads are told to stop and
joined, both subscriptions are cancelled, and the stream (aclrtDestroyStreamForce), the
context and the device are released.

The program checks what the vendor program shows: the callbacks ran in stream order on
the report thread, the host function on the host-function thread, all saw 520, and the
counter is 1. The vendor's Ascend C kernel `LongOPf` (a long floating-point loop that
settles near 1e-5, then adds 1 to the block's counter if the result is positive) is the
Python kernel `long_op` below, with fewer rounds.

Run: python examples/cann/2_advanced_features/callback/0_simple_callback.py
"""

import ctypes
import struct
import sys
import threading
import time

import acl

DEVICE_ID = 0
BLOCKS = 1
WAIT_MS = 100
USER_DATA = 520
CALLBACKS_AFTER = 5

KERNEL_SOURCE = """
import numpy as np

from simnpu import kernel


@kernel("ptr")
def long_op(ctx, x):
    f = np.float32
    temp = f(0.0)
    for _ in range(100):
        temp = (temp + f(0.00002)) * f(0.02)
        for _ in range(250):
            temp = temp * temp - f(0.000002)
            temp = temp + temp * f(0.05)
            temp = temp * temp + f(0.00001)
            temp = f(0.0) if temp > f(1.0) else temp
        temp -= f(0.00003) * temp
    counter = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    counter += 1 if temp > 0 else 0
"""


class Failed(Exception):
    """A call returned an error code; the message names it."""


def check(ret: int, call: str) -> None:
    if ret != acl.ACL_SUCCESS:
        raise Failed(f"{call} returned error code {ret}: {acl.get_recent_err_msg()}")


ran: list[tuple[str, int, int]] = []  # (what, thread id, user data), in the order they ran
_print_lock = threading.Lock()


def info(message: str) -> None:
    """Print one whole line even while other threads print."""
    with _print_lock:
        print(f"[INFO]  {message}", flush=True)


def serve(context: int, process: str, keep_going: threading.Event, name: str) -> None:
    """A serving thread: set the context, then call acl.rt.<process> until told to stop."""
    ret = acl.rt.set_context(context)
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR]  set_context in the {name} thread returned {ret}")
        return
    process_one = getattr(acl.rt, process)
    while keep_going.is_set():
        if process_one(WAIT_MS) == acl.ACL_ERROR_RT_THREAD_SUBSCRIBE:
            time.sleep(0.001)  # not subscribed yet: the call returns at once
    info(f"The {name} thread exits.")


def callback_before_task(user_data: list[int]) -> None:
    info(f"Callback on thread {threading.get_ident()}.")
    info(f"The callback before the kernel sees user data {user_data[0]}.")
    ran.append(("callback before", threading.get_ident(), user_data[0]))


def callback_after_task(user_data: list[int]) -> None:
    info(f"Callback on thread {threading.get_ident()}.")
    info(f"A callback after the kernel sees user data {user_data[0]}.")
    ran.append(("callback after", threading.get_ident(), user_data[0]))


def host_function(user_data: list[int]) -> None:
    info(f"Host function on thread {threading.get_ident()}.")
    info(f"The host function, on its subscribed thread, sees user data {user_data[0]}.")
    ran.append(("host function", threading.get_ident(), user_data[0]))


def run_callbacks(context: int, stream: int) -> list[str]:
    """Queue and serve the callbacks; return what went wrong (nothing, when all is right)."""
    num = ctypes.c_uint32(0)
    size = ctypes.sizeof(num)
    num_device, ret = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    ret = acl.rt.memcpy(
        num_device, size, ctypes.addressof(num), size, acl.ACL_MEMCPY_HOST_TO_DEVICE
    )
    check(ret, "acl.rt.memcpy")

    report_loop, host_func_loop = threading.Event(), threading.Event()
    report_loop.set()
    host_func_loop.set()
    report_thread = threading.Thread(
        target=serve,
        args=(context, "process_report", report_loop, "report"),
        daemon=True,
    )
    host_func_thread = threading.Thread(
        target=serve,
        args=(context, "process_host_func", host_func_loop, "host-function"),
        daemon=True,
    )
    report_thread.start()
    host_func_thread.start()
    report_id, host_func_id = report_thread.ident, host_func_thread.ident
    assert report_id is not None and host_func_id is not None
    info(f"Main thread: {threading.get_ident()}.")
    info(f"Report thread: {report_id}.")
    info(f"Host-function thread: {host_func_id}.")

    user_data = [USER_DATA]
    check(acl.rt.subscribe_report(report_id, stream), "acl.rt.subscribe_report")
    check(acl.rt.subscribe_host_func(host_func_id, stream), "acl.rt.subscribe_host_func")
    ret = acl.rt.launch_callback(callback_before_task, user_data, acl.ACL_CALLBACK_BLOCK, stream)
    check(ret, "acl.rt.launch_callback")
    binary, ret = acl.rt.binary_load_from_data(KERNEL_SOURCE)
    check(ret, "acl.rt.binary_load_from_data")
    long_op, ret = acl.rt.binary_get_function(binary, "long_op")
    check(ret, "acl.rt.binary_get_function")
    args = struct.pack("<Q", num_device)
    ret = acl.rt.launch_kernel_with_host_args(
        long_op, BLOCKS, stream, None, acl.util.bytes_to_ptr(args), len(args)
    )
    check(ret, "acl.rt.launch_kernel_with_host_args")
    check(acl.rt.launch_host_func(stream, host_function, user_data), "acl.rt.launch_host_func")
    info(f"Kernel queued, then a host function and {CALLBACKS_AFTER} callbacks.")
    for _ in range(CALLBACKS_AFTER):
        ret = acl.rt.launch_callback(callback_after_task, user_data, acl.ACL_CALLBACK_BLOCK, stream)
        check(ret, "acl.rt.launch_callback")

    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    ret = acl.rt.memcpy(
        ctypes.addressof(num), size, num_device, size, acl.ACL_MEMCPY_DEVICE_TO_HOST
    )
    check(ret, "acl.rt.memcpy")
    info(f"After the stream's tasks the counter is: {num.value}.")

    report_loop.clear()
    host_func_loop.clear()
    report_thread.join()
    host_func_thread.join()
    check(acl.rt.unsubscribe_report(report_id, stream), "acl.rt.unsubscribe_report")
    check(acl.rt.unsubscribe_host_func(host_func_id, stream), "acl.rt.unsubscribe_host_func")
    check(acl.rt.free(num_device), "acl.rt.free")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")

    expected = [
        ("callback before", report_id, USER_DATA),
        ("host function", host_func_id, USER_DATA),
        *[("callback after", report_id, USER_DATA)] * CALLBACKS_AFTER,
    ]
    problems = []
    if ran != expected:
        problems.append(f"callbacks ran as {ran}, expected {expected}")
    if num.value != 1:
        problems.append(f"the counter is {num.value}, expected 1")
    return problems


def main() -> int:
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    context, ret = acl.rt.create_context(DEVICE_ID)
    check(ret, "acl.rt.create_context")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    ret = acl.rt.set_stream_failure_mode(stream, acl.ACL_STOP_ON_FAILURE)
    check(ret, "acl.rt.set_stream_failure_mode")

    problems = run_callbacks(context, stream)

    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    for problem in problems:
        print(f"[ERROR]  {problem}")
    if problems:
        return 1
    print("[INFO]  simple_callback: every callback ran in order on its thread; done.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as failure:
        print(f"[ERROR]  {failure}")
        sys.exit(1)
