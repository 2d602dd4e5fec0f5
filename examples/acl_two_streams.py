"""Lesson: overlap copies and compute with two streams, ordered by events (pyACL).

A batch is processed in chunks. A copy stream moves each chunk host -> device and records
an event; the compute stream waits for that event (a device-side wait: the host does not
block), sums the chunk's rows, then copies the sums back. While the compute stream works on
chunk i, the copy stream is already moving chunk i+1. Events time the pipeline on the
device clock against the same work on one stream; the copies and the kernels timed alone
give the overlap to expect; every result is checked against numpy.

Run: python examples/acl_two_streams.py   (a daemon is started if none runs)
"""

import ctypes
import os
import struct

import numpy as np

import acl

CHUNKS = 8
ROWS, COLS = 2048, 1024  # one chunk: 2048 rows of 1024 float32 (8 MiB)
CHUNK_BYTES = ROWS * COLS * 4
SUM_BYTES = ROWS * 4
BLOCKS = 1  # one AI core sums a chunk; the copy engine needs a CPU of its own meanwhile


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        raise SystemExit(f"{what} failed: ret={ret} ({acl.get_recent_err_msg()})")


def host_array(ptr, nbytes, dtype=np.float32):
    """A numpy view of pinned host memory (acl.rt.malloc_host pointers are real addresses)."""
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype)


def run_pipeline(
    copy_stream,
    compute_stream,
    host_in,
    host_out,
    dev_in,
    dev_out,
    row_sum,
    parts=("copies", "sums"),
):
    """Queue the whole batch (or only its copies in, or only its sums), wait for it and
    return its device time in ms (the events that bracket it)."""
    start, ret = acl.rt.create_event()
    check(ret, "create_event")
    end, ret = acl.rt.create_event()
    check(ret, "create_event")
    copied = []
    check(acl.rt.record_event(start, copy_stream), "record_event")
    check(acl.rt.stream_wait_event(compute_stream, start), "stream_wait_event")
    for i in range(CHUNKS):
        if "copies" in parts:
            check(
                acl.rt.memcpy_async(
                    dev_in[i],
                    CHUNK_BYTES,
                    host_in + i * CHUNK_BYTES,
                    CHUNK_BYTES,
                    acl.ACL_MEMCPY_HOST_TO_DEVICE,
                    copy_stream,
                ),
                "memcpy_async H2D",
            )
            event, ret = acl.rt.create_event()
            check(ret, "create_event")
            copied.append(event)
            check(acl.rt.record_event(event, copy_stream), "record_event")
            # Without this wait the kernel could read the chunk before the copy has landed.
            check(acl.rt.stream_wait_event(compute_stream, event), "stream_wait_event")
        if "sums" in parts:
            args = struct.pack("<QQII", dev_in[i], dev_out[i], ROWS, COLS)  # (x, y, rows, cols)
            check(
                acl.rt.launch_kernel_with_host_args(
                    row_sum, BLOCKS, compute_stream, None, acl.util.bytes_to_ptr(args), len(args)
                ),
                "launch",
            )
            check(
                acl.rt.memcpy_async(
                    host_out + i * SUM_BYTES,
                    SUM_BYTES,
                    dev_out[i],
                    SUM_BYTES,
                    acl.ACL_MEMCPY_DEVICE_TO_HOST,
                    compute_stream,
                ),
                "memcpy_async D2H",
            )
    check(acl.rt.record_event(end, compute_stream), "record_event")
    check(acl.rt.synchronize_event(end), "synchronize_event")
    # An event synchronize returns 0 even if a task failed (ACL_CONTINUE_ON_FAILURE); the
    # streams' synchronizes report a failed copy or kernel: check them before reading results.
    check(acl.rt.synchronize_stream(copy_stream), "synchronize_stream")
    check(acl.rt.synchronize_stream(compute_stream), "synchronize_stream")
    elapsed, ret = acl.rt.event_elapsed_time(start, end)
    check(ret, "event_elapsed_time")
    for event in [start, end, *copied]:
        check(acl.rt.destroy_event(event), "destroy_event")
    return elapsed


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "set_device")
    context, ret = acl.rt.create_context(0)
    check(ret, "create_context")
    copy_stream, ret = acl.rt.create_stream()
    check(ret, "create_stream")
    compute_stream, ret = acl.rt.create_stream()
    check(ret, "create_stream")

    total = CHUNKS * CHUNK_BYTES
    host_in, ret = acl.rt.malloc_host(total)  # pinned: async copies from it are truly async
    check(ret, "malloc_host")
    host_out, ret = acl.rt.malloc_host(CHUNKS * SUM_BYTES)
    check(ret, "malloc_host")
    inputs = host_array(host_in, total).reshape(CHUNKS, ROWS, COLS)
    outputs = host_array(host_out, CHUNKS * SUM_BYTES).reshape(CHUNKS, ROWS)
    inputs[:] = np.random.default_rng(0).standard_normal(inputs.shape, dtype=np.float32)

    dev_in, dev_out = [], []
    for buffers, size in ((dev_in, CHUNK_BYTES), (dev_out, SUM_BYTES)):
        for _ in range(CHUNKS):
            ptr, ret = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
            check(ret, "malloc")
            buffers.append(ptr)
    row_sum, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "reduce_sum_f32")
    check(ret, "binary_get_function")
    work = (host_in, host_out, dev_in, dev_out, row_sum)
    expected = inputs.sum(axis=-1)

    run_pipeline(compute_stream, compute_stream, *work)  # warm-up
    copies_ms = run_pipeline(copy_stream, compute_stream, *work, parts=("copies",))
    sums_ms = run_pipeline(copy_stream, compute_stream, *work, parts=("sums",))
    results = {}
    for label, first in (("two streams", copy_stream), ("one stream", compute_stream)):
        outputs[:] = 0
        results[label] = run_pipeline(first, compute_stream, *work)
        np.testing.assert_allclose(outputs, expected, rtol=1e-4, atol=1e-3)
    one, two = results["one stream"], results["two streams"]
    # Perfect overlap hides the shorter part behind the longer one, all but one chunk.
    ideal = max(copies_ms, sums_ms) + min(copies_ms, sums_ms) / CHUNKS

    print(f"row sums of {CHUNKS} chunks of {ROWS}x{COLS} float32: every result matches numpy")
    print(f"  copies in alone:             {copies_ms:7.2f} ms (device clock)")
    print(f"  sums and copies out alone:   {sums_ms:7.2f} ms")
    print(f"  one stream:                  {one:7.2f} ms")
    print(f"  two streams, with events:    {two:7.2f} ms, {one / two:.2f}x faster than one stream")
    print(f"  expected with full overlap:  {ideal:7.2f} ms, {(copies_ms + sums_ms) / ideal:.2f}x")
    print(
        "  the copy of chunk i+1 overlaps the sums of chunk i "
        "only when they are on different streams"
    )
    if one / two < 1.1:
        print(
            "  little overlap measured: the copy engine and the AI core are processes of this "
            "machine; they overlap when each has a free CPU, and both copies and sums share "
            f"its memory bandwidth ({os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f})"
        )

    del inputs, outputs
    for ptr in dev_in + dev_out:
        check(acl.rt.free(ptr), "free")
    check(acl.rt.free_host(host_in), "free_host")
    check(acl.rt.free_host(host_out), "free_host")
    check(acl.rt.destroy_stream(copy_stream), "destroy_stream")
    check(acl.rt.destroy_stream(compute_stream), "destroy_stream")
    check(acl.rt.destroy_context(context), "destroy_context")
    check(acl.rt.reset_device(0), "reset_device")
    check(acl.finalize(), "acl.finalize")


if __name__ == "__main__":
    main()
