"""Lesson: overlap copies and compute with two streams, ordered by events (pyACL).

A batch is processed in chunks. A copy stream moves each chunk host -> device and records
an event; the compute stream waits for that event (a device-side wait: the host does not
block) and runs softmax on the chunk, then copies the result back. While the compute
stream works on chunk i, the copy stream is already moving chunk i+1. Events time the
pipeline on the device clock; the same work on one stream is timed for comparison, and
every result is checked against numpy.

Run: python examples/acl_two_streams.py   (a daemon is started if none runs)
"""

import ctypes
import struct

import numpy as np

import acl

CHUNKS = 8
ROWS, COLS = 512, 512  # one chunk: 512 rows of 512 float32 (1 MiB)
CHUNK_BYTES = ROWS * COLS * 4


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        raise SystemExit(f"{what} failed: ret={ret} ({acl.get_recent_err_msg()})")


def host_array(ptr, nbytes, dtype=np.float32):
    """A numpy view of pinned host memory (acl.rt.malloc_host pointers are real addresses)."""
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype)


def run_pipeline(copy_stream, compute_stream, host_in, host_out, dev_in, dev_out, softmax):
    """Queue the whole batch; returns the (start, end) events that bracket it."""
    start, ret = acl.rt.create_event()
    check(ret, "create_event")
    end, ret = acl.rt.create_event()
    check(ret, "create_event")
    copied = []
    check(acl.rt.record_event(start, copy_stream), "record_event")
    check(acl.rt.stream_wait_event(compute_stream, start), "stream_wait_event")
    for i in range(CHUNKS):
        offset = i * CHUNK_BYTES
        check(
            acl.rt.memcpy_async(
                dev_in[i],
                CHUNK_BYTES,
                host_in + offset,
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
        args = struct.pack(
            "<QQII", dev_in[i], dev_out[i], ROWS, COLS
        )  # softmax_f32(x, y, rows, cols)
        check(
            acl.rt.launch_kernel_with_host_args(
                softmax, 2, compute_stream, None, acl.util.bytes_to_ptr(args), len(args)
            ),
            "launch",
        )
        check(
            acl.rt.memcpy_async(
                host_out + offset,
                CHUNK_BYTES,
                dev_out[i],
                CHUNK_BYTES,
                acl.ACL_MEMCPY_DEVICE_TO_HOST,
                compute_stream,
            ),
            "memcpy_async D2H",
        )
    check(acl.rt.record_event(end, compute_stream), "record_event")
    check(acl.rt.synchronize_event(end), "synchronize_event")
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
    host_out, ret = acl.rt.malloc_host(total)
    check(ret, "malloc_host")
    inputs = host_array(host_in, total).reshape(CHUNKS, ROWS, COLS)
    outputs = host_array(host_out, total).reshape(CHUNKS, ROWS, COLS)
    inputs[:] = np.random.default_rng(0).standard_normal(inputs.shape, dtype=np.float32)

    dev_in, dev_out = [], []
    for _ in range(CHUNKS):
        for buffers in (dev_in, dev_out):
            ptr, ret = acl.rt.malloc(CHUNK_BYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST)
            check(ret, "malloc")
            buffers.append(ptr)
    softmax, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "softmax_f32")
    check(ret, "binary_get_function")

    expected = np.exp(inputs - inputs.max(axis=-1, keepdims=True))
    expected /= expected.sum(axis=-1, keepdims=True)

    run_pipeline(
        compute_stream, compute_stream, host_in, host_out, dev_in, dev_out, softmax
    )  # warm-up
    results = {}
    for label, first in (
        ("two streams, ordered by events", copy_stream),
        ("one stream", compute_stream),
    ):
        outputs[:] = 0
        results[label] = run_pipeline(
            first, compute_stream, host_in, host_out, dev_in, dev_out, softmax
        )
        np.testing.assert_allclose(outputs, expected, rtol=1e-5, atol=1e-7)

    print(f"softmax of {CHUNKS} chunks of {ROWS}x{COLS} float32: every result matches numpy")
    for label, elapsed in results.items():
        print(f"  copy + compute on {label:32s} {elapsed:8.2f} ms (device clock)")
    print(
        "  the copy of chunk i+1 overlaps the softmax of chunk i "
        "only when they are on different streams"
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
