"""Lesson: run host code in stream order with callbacks instead of blocking the host (pyACL).

Each batch is copied to the device, doubled by a kernel and copied back into pinned memory;
then acl.rt.launch_callback queues a host callback on the same stream. The callback runs
only when the stream reaches it -- after the copy back -- so it can consume the result
while the main thread goes on queueing the next batches. Callbacks run on a thread the
program provides: acl.util.start_thread starts it, it loops on acl.rt.process_report, and
acl.rt.subscribe_report hands it the stream's callbacks. acl.rt.launch_host_func needs no
such thread (the runtime runs the function), and the stream waits for it as well.

Run: python examples/acl_host_callback.py   (a daemon is started if none runs)
"""

import ctypes
import struct
import threading
import time

import numpy as np

import acl

BATCHES = 6
N = 4096
NBYTES = N * 4

consumed = []  # (batch, correct?) in the order the callbacks ran
stop_reporting = threading.Event()


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        raise SystemExit(f"{what} failed: ret={ret} ({acl.get_recent_err_msg()})")


def report_loop(args):
    """The callback thread: it has no context of its own, so it sets the main one first."""
    context, timeout_ms = args
    check(acl.rt.set_context(context), "set_context (callback thread)")
    while not stop_reporting.is_set():
        ret = acl.rt.process_report(timeout_ms)  # runs one callback, or times out
        if ret == acl.ACL_ERROR_RT_THREAD_SUBSCRIBE:  # subscribe_report has not run yet
            time.sleep(0.001)
        elif ret not in (acl.ACL_SUCCESS, acl.ACL_ERROR_RT_REPORT_TIMEOUT):
            print(f"process_report returned {ret}: {acl.get_recent_err_msg()}")
            return


def consume(user_data):
    """A host callback: user_data is the list given to launch_callback."""
    batch, view, expected = user_data
    consumed.append((batch, bool(np.array_equal(view, expected))))


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "set_device")
    context, ret = acl.rt.create_context(0)
    check(ret, "create_context")
    stream, ret = acl.rt.create_stream()
    check(ret, "create_stream")
    thread_id, ret = acl.util.start_thread(report_loop, [context, 100])
    check(ret, "start_thread")
    check(acl.rt.subscribe_report(thread_id, stream), "subscribe_report")

    double, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f32")  # x + x
    check(ret, "binary_get_function")
    dev_x, ret = acl.rt.malloc(NBYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc")
    dev_y, ret = acl.rt.malloc(NBYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc")
    host_in, ret = acl.rt.malloc_host(BATCHES * NBYTES)
    check(ret, "malloc_host")
    host_out, ret = acl.rt.malloc_host(BATCHES * NBYTES)
    check(ret, "malloc_host")
    inputs = np.frombuffer((ctypes.c_char * (BATCHES * NBYTES)).from_address(host_in), np.float32)
    outputs = np.frombuffer((ctypes.c_char * (BATCHES * NBYTES)).from_address(host_out), np.float32)
    inputs[:] = np.arange(BATCHES * N, dtype=np.float32)
    outputs[:] = 0
    args = struct.pack("<QQQI", dev_x, dev_x, dev_y, N)  # add_f32(x, y, z, n); keep it alive
    args_ptr = acl.util.bytes_to_ptr(args)
    host_functions = []

    for batch in range(BATCHES):
        offset = batch * NBYTES
        check(
            acl.rt.memcpy_async(
                dev_x, NBYTES, host_in + offset, NBYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream
            ),
            "memcpy_async H2D",
        )
        check(
            acl.rt.launch_kernel_with_host_args(double, 2, stream, None, args_ptr, len(args)),
            "launch",
        )
        check(
            acl.rt.memcpy_async(
                host_out + offset, NBYTES, dev_y, NBYTES, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream
            ),
            "memcpy_async D2H",
        )
        view = outputs[batch * N : (batch + 1) * N]
        expected = 2 * inputs[batch * N : (batch + 1) * N]
        check(
            acl.rt.launch_callback(
                consume, [batch, view, expected], acl.ACL_CALLBACK_BLOCK, stream
            ),
            "launch_callback",
        )
        check(acl.rt.launch_host_func(stream, host_functions.append, batch), "launch_host_func")
    print(f"queued {BATCHES} batches; callbacks consumed so far: {len(consumed)}")

    check(acl.rt.synchronize_stream(stream), "synchronize_stream")
    print(
        f"after synchronize_stream: callbacks ran for batches {[batch for batch, _ in consumed]}, "
        f"host functions for {host_functions}"
    )
    assert consumed == [(batch, True) for batch in range(BATCHES)], consumed
    assert host_functions == list(range(BATCHES)), host_functions
    print("every callback ran in stream order and saw its batch's finished result")

    # A stream nobody subscribed to cannot take callbacks.
    other, ret = acl.rt.create_stream()
    check(ret, "create_stream")
    ret = acl.rt.launch_callback(consume, [], acl.ACL_CALLBACK_NO_BLOCK, other)
    assert ret == acl.ACL_ERROR_RT_STREAM_NO_CB_REG, ret
    print(f"launch_callback on an unsubscribed stream returns {ret}")

    check(acl.rt.unsubscribe_report(thread_id, stream), "unsubscribe_report")
    stop_reporting.set()
    check(acl.util.stop_thread(thread_id), "stop_thread")
    del inputs, outputs, view, expected
    consumed.clear()
    for ptr in (host_in, host_out):
        check(acl.rt.free_host(ptr), "free_host")
    for ptr in (dev_x, dev_y):
        check(acl.rt.free(ptr), "free")
    check(acl.rt.destroy_stream(other), "destroy_stream")
    check(acl.rt.destroy_stream(stream), "destroy_stream")
    check(acl.rt.destroy_context(context), "destroy_context")
    check(acl.rt.reset_device(0), "reset_device")
    check(acl.finalize(), "acl.finalize")


if __name__ == "__main__":
    main()
