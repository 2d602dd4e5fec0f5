"""Follows the CANN runtime's example/2_advanced_features/callback/2_callback_exception.

What a program learns when a kernel fails. A thread subscribed to the stream
(aclrtSubscribeReport) serves its callbacks with aclrtProcessReport, and an exception
callback is set with aclrtSetExceptionInfoCallback. On a stream that stops at the first
failure the program launches a kernel that adds 1 to a counter, then a kernel that
traps, reads its thread's last task id (aclrtGetThreadLastTaskId) and queues a callback.
aclrtSynchronizeStream fails; before it returns, the exception callback prints what the
exception info tells (task, stream, thread, device, error code, the launch's arguments
and function, aclrtGet*FromExceptionInfo). The program then prints the runtime's
diagnostics (aclrtGetErrorVerbose, aclrtPeekAtLastError, aclrtGetLastError,
aclGetRecentErrMsg), reads the counter back, stops and joins the thread, and releases
everything.

The program checks that the exception callback ran once for the trapping kernel's task
(the last task id read before the synchronize) on this stream, thread and device, with
the code the synchronize returned; that the callback queued after the failure never ran
(the stream stopped); and that the first kernel's work was kept (counter 1). The vendor's
Ascend C kernels `EasyOPf` and `ErrorOPf` (which executes a trap) are the Python kernels
`easy_op` and `error_op` below. simnpu keeps no device copy of arguments passed from host
memory, so the arguments query returns ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000) here.

Run: python examples/cann/2_advanced_features/callback/2_callback_exception.py
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

KERNEL_SOURCE = """
from simnpu import kernel


@kernel("ptr")
def easy_op(ctx, x):
    counter = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    counter += 1


@kernel()
def error_op(ctx):
    raise RuntimeError("trap")
"""

_print_lock = threading.Lock()
exceptions: list[dict[str, object]] = []  # what each exception callback learnt
callbacks_run: list[int] = []  # user data of the callbacks that ran


class Failed(Exception):
    """A call returned an error code; the message names it."""


def check(ret: int, call: str) -> None:
    if ret != acl.ACL_SUCCESS:
        raise Failed(f"{call} returned error code {ret}: {acl.get_recent_err_msg()}")


def log(level: str, message: str) -> None:
    """Print one whole line even while other threads print."""
    with _print_lock:
        print(f"[{level}]  {message}", flush=True)


def serve_reports(context: int, keep_going: threading.Event) -> None:
    """The subscribed thread: set the context, then process callbacks until told to stop."""
    acl.rt.set_context(context)
    while keep_going.is_set():
        if acl.rt.process_report(WAIT_MS) == acl.ACL_ERROR_RT_THREAD_SUBSCRIBE:
            time.sleep(0.001)  # not subscribed yet: the call returns at once
    log("INFO", "The report thread exits.")


def after_error_callback(user_data: list[int]) -> None:
    log("INFO", f"A callback after the failure ran, user data {user_data[0]}.")
    callbacks_run.append(user_data[0])


def exception_callback(info: int) -> None:
    """Set with set_exception_info_callback: runs before the failing call returns."""
    log("INFO", "An exception occurred: the exception callback runs.")
    seen: dict[str, object] = {
        "task id": acl.rt.get_task_id_from_exception_info(info),
        "stream id": acl.rt.get_stream_id_from_exception_info(info),
        "thread id": acl.rt.get_thread_id_from_exception_info(info),
        "device id": acl.rt.get_device_id_from_exception_info(info),
        "error code": acl.rt.get_error_code_from_exception_info(info),
    }
    for what, value in seen.items():
        log("INFO", f"The failed task's {what}: {value}.")
    (args_ptr, args_len), args_ret = acl.rt.get_args_from_exception_info(info)
    log("INFO", f"Arguments query: ret={args_ret}, dev_args_ptr={args_ptr:#x}, len={args_len}.")
    func, func_ret = acl.rt.get_func_handle_from_exception_info(info)
    log("INFO", f"Function query: ret={func_ret}, func={func:#x}.")
    seen["func"] = func
    exceptions.append(seen)


def log_error_state() -> None:
    """The runtime's diagnostics after the failed synchronize."""
    error_info, ret = acl.rt.get_error_verbose(DEVICE_ID)
    if ret == acl.ACL_SUCCESS:
        log(
            "INFO",
            f"Verbose error info: error_type={error_info['error_type']}, "
            f"try_repair={error_info['try_repair']}, has_detail={error_info['has_detail']}.",
        )
    else:
        log("WARN", f"acl.rt.get_error_verbose returned error code {ret}.")
    peeked = acl.rt.peek_at_last_error(acl.ACL_RT_THREAD_LEVEL)
    last = acl.rt.get_last_error(acl.ACL_RT_THREAD_LEVEL)
    message = acl.get_recent_err_msg()
    first_line = message.splitlines()[0] if message else "<none>"
    log("ERROR", f"Diagnostics: peeked {peeked}, last {last}, recent message: {first_line}")


def run(context: int, stream: int) -> list[str]:
    """Launch the two kernels and the callback; return what went wrong."""
    num = ctypes.c_uint32(0)
    size = ctypes.sizeof(num)
    num_device, ret = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    ret = acl.rt.memcpy(
        num_device, size, ctypes.addressof(num), size, acl.ACL_MEMCPY_HOST_TO_DEVICE
    )
    check(ret, "acl.rt.memcpy")

    keep_going = threading.Event()
    keep_going.set()
    thread = threading.Thread(target=serve_reports, args=(context, keep_going), daemon=True)
    thread.start()
    assert thread.ident is not None
    user_data = [USER_DATA]
    check(acl.rt.subscribe_report(thread.ident, stream), "acl.rt.subscribe_report")
    check(acl.rt.set_exception_info_callback(exception_callback), "set_exception_info_callback")
    log("INFO", "Launching a kernel that works and one that traps (the exception callback).")

    binary, ret = acl.rt.binary_load_from_data(KERNEL_SOURCE)
    check(ret, "acl.rt.binary_load_from_data")
    easy_op, ret = acl.rt.binary_get_function(binary, "easy_op")
    check(ret, "acl.rt.binary_get_function")
    error_op, ret = acl.rt.binary_get_function(binary, "error_op")
    check(ret, "acl.rt.binary_get_function")
    easy_args = struct.pack("<Q", num_device)
    ret = acl.rt.launch_kernel_with_host_args(
        easy_op, BLOCKS, stream, None, acl.util.bytes_to_ptr(easy_args), len(easy_args)
    )
    check(ret, "acl.rt.launch_kernel_with_host_args(easy_op)")
    no_args = bytes(1)  # error_op takes no arguments; the buffer must still not be null
    ret = acl.rt.launch_kernel_with_host_args(
        error_op, BLOCKS, stream, None, acl.util.bytes_to_ptr(no_args), 0
    )
    check(ret, "acl.rt.launch_kernel_with_host_args(error_op)")
    last_task, ret = acl.rt.get_thread_last_task_id()
    check(ret, "acl.rt.get_thread_last_task_id")
    log("INFO", f"This thread's last task id: {last_task}.")
    ret = acl.rt.launch_callback(after_error_callback, user_data, acl.ACL_CALLBACK_BLOCK, stream)
    check(ret, "acl.rt.launch_callback")

    sync_ret = acl.rt.synchronize_stream(stream)
    if sync_ret != acl.ACL_SUCCESS:
        log("ERROR", f"acl.rt.synchronize_stream returned error code {sync_ret}")
        log_error_state()
    ret = acl.rt.memcpy(
        ctypes.addressof(num), size, num_device, size, acl.ACL_MEMCPY_DEVICE_TO_HOST
    )
    if ret == acl.ACL_SUCCESS:
        log("INFO", f"After the tasks the counter is: {num.value}.")
    else:
        log("ERROR", f"acl.rt.memcpy after the failure returned error code {ret}")

    keep_going.clear()
    thread.join()
    check(acl.rt.unsubscribe_report(thread.ident, stream), "acl.rt.unsubscribe_report")
    check(acl.rt.set_exception_info_callback(None), "set_exception_info_callback(None)")
    check(acl.rt.free(num_device), "acl.rt.free")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")

    stream_id, ret = acl.rt.stream_get_id(stream)
    check(ret, "acl.rt.stream_get_id")
    expected = {
        "task id": last_task,
        "stream id": stream_id,
        "thread id": threading.get_native_id(),
        "device id": DEVICE_ID,
        "error code": acl.ACL_ERROR_RT_AICORE_EXCEPTION,
        "func": error_op,
    }
    problems = []
    if sync_ret != acl.ACL_ERROR_RT_AICORE_EXCEPTION:
        problems.append(f"the synchronize returned {sync_ret}, not 507015")
    if exceptions != [expected]:
        problems.append(f"exception callbacks saw {exceptions}, expected [{expected}]")
    if callbacks_run:
        problems.append("the callback queued after the failure ran on a stopped stream")
    if ret == acl.ACL_SUCCESS and num.value != 1:
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

    problems = run(context, stream)

    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    for problem in problems:
        log("ERROR", problem)
    if problems:
        return 1
    log("INFO", "callback_exception: the failure was reported as expected; done.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as failure:
        print(f"[ERROR]  {failure}")
        sys.exit(1)
