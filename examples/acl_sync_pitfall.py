"""Lesson: a launch only queues work -- read the results after synchronizing (pyACL).

The program queues y = 2 * x and a device -> host copy of y into pinned memory, then
reads the host buffer at once: it still holds the old bytes, because both calls returned
as soon as the work was queued. A synchronous acl.rt.memcpy is no better: it is not
ordered with any stream, so it copies y before the kernel has written it. The fix is
acl.rt.synchronize_stream (or an event) before reading.

On real hardware whether the early read sees old or half-written data depends on how long
the kernel takes; to show the same thing on every run, a host function queued first keeps
the stream busy until the program has looked (acl.rt.launch_host_func runs in stream
order, and the stream waits for it).

Run: python examples/acl_sync_pitfall.py   (a daemon is started if none runs)
"""

import ctypes
import struct
import threading

import numpy as np

import acl

N = 1 << 16
NBYTES = N * 4
SCALE_KERNEL = b"""
import numpy as np
from simnpu import kernel

@kernel("ptr", "ptr", "f32", "u32")
def scale_f32(ctx, x, y, factor, n):
    share = -(-n // ctx.block_num)
    start = ctx.block_idx * share
    count = max(0, min(n, start + share) - start)
    if count:
        np.multiply(ctx.gm(x + 4 * start, "float32", count, access="r"), factor,
                    out=ctx.gm(y + 4 * start, "float32", count))
"""


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        raise SystemExit(f"{what} failed: ret={ret} ({acl.get_recent_err_msg()})")


def shares_memory_with_the_daemon():
    """simnpu-specific: False for a client that cannot map the daemon's shared memory (another
    container, SIMNPU_NO_SHM=1): its pinned memory is private and copies from it are staged."""
    from simnpu.client import device

    return device.runtime().memory.uses_shared_memory


def main():
    check(acl.init(), "acl.init")
    if not shares_memory_with_the_daemon():
        # The copy into pinned memory would be staged: it would wait for the held stream.
        print(
            "this lesson needs pinned memory shared with the daemon (not available to this client)"
        )
        check(acl.finalize(), "acl.finalize")
        return
    check(acl.rt.set_device(0), "set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "create_stream")
    binary, ret = acl.rt.binary_load_from_data(SCALE_KERNEL, None)
    check(ret, "binary_load_from_data")
    scale, ret = acl.rt.binary_get_function(binary, "scale_f32")
    check(ret, "binary_get_function")

    x = np.arange(N, dtype=np.float32)
    expected = 2 * x
    x_bytes = x.tobytes()
    dev_x, ret = acl.rt.malloc(NBYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc")
    dev_y, ret = acl.rt.malloc(NBYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc")
    check(
        acl.rt.memcpy(
            dev_x, NBYTES, acl.util.bytes_to_ptr(x_bytes), NBYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE
        ),
        "memcpy H2D",
    )
    check(acl.rt.memset(dev_y, NBYTES, 0, NBYTES), "memset")
    host_y, ret = acl.rt.malloc_host(NBYTES)
    check(ret, "malloc_host")
    result = np.frombuffer((ctypes.c_char * NBYTES).from_address(host_y), np.float32)
    result[:] = -1

    # Keep the stream busy until we have looked (see the module docstring).
    looked = threading.Event()
    check(acl.rt.launch_host_func(stream, lambda _: looked.wait(60), None), "launch_host_func")

    args = struct.pack("<QQfI", dev_x, dev_y, 2.0, N)
    check(
        acl.rt.launch_kernel_with_host_args(
            scale, 4, stream, None, acl.util.bytes_to_ptr(args), len(args)
        ),
        "launch",
    )
    check(
        acl.rt.memcpy_async(host_y, NBYTES, dev_y, NBYTES, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream),
        "memcpy_async D2H",
    )

    # Pitfall 1: read the destination of the async copy without synchronizing.
    early = result.copy()
    status, ret = acl.rt.stream_query(stream)
    check(ret, "stream_query")
    # Pitfall 2: a synchronous memcpy is not ordered with the stream either.
    sync_copy = bytes(NBYTES)
    check(
        acl.rt.memcpy(
            acl.util.bytes_to_ptr(sync_copy), NBYTES, dev_y, NBYTES, acl.ACL_MEMCPY_DEVICE_TO_HOST
        ),
        "memcpy D2H",
    )
    sync_copy = np.frombuffer(sync_copy, np.float32)
    looked.set()

    # The fix: wait for the stream, then read.
    check(acl.rt.synchronize_stream(stream), "synchronize_stream")
    status_after, ret = acl.rt.stream_query(stream)
    check(ret, "stream_query")

    print(f"y = 2 * x for {N} floats; the first values should be {expected[:4]}")
    print(
        f"  read without synchronizing:      {early[:4]}  (stream_query: "
        f"{'NOT_READY' if status == acl.ACL_STREAM_STATUS_NOT_READY else 'COMPLETE'})"
    )
    print(f"  synchronous memcpy of y instead: {sync_copy[:4]}  (not ordered with the stream)")
    print(
        f"  after synchronize_stream:        {result[:4]}  (stream_query: "
        f"{'NOT_READY' if status_after == acl.ACL_STREAM_STATUS_NOT_READY else 'COMPLETE'})"
    )
    assert (
        status == acl.ACL_STREAM_STATUS_NOT_READY and status_after == acl.ACL_STREAM_STATUS_COMPLETE
    )
    assert np.all(early == -1), "the early read already saw results"
    assert not np.array_equal(sync_copy, expected), "the synchronous copy saw the kernel's results"
    np.testing.assert_array_equal(result, expected)
    print("  only the synchronized read is right")

    del result
    check(acl.rt.free_host(host_y), "free_host")
    check(acl.rt.free(dev_x), "free")
    check(acl.rt.free(dev_y), "free")
    check(acl.rt.binary_unload(binary), "binary_unload")
    check(acl.rt.destroy_stream(stream), "destroy_stream")
    check(acl.rt.reset_device(0), "reset_device")
    check(acl.finalize(), "acl.finalize")


if __name__ == "__main__":
    main()
