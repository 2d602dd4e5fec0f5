"""Overlap copies and compute with two streams, in one program (the Pythonic API).

Chunks of a batch go host -> device on a copy stream; a compute stream waits for each
chunk's event (a device-side wait: the host does not block), then sums the chunk's rows.
While the AI core sums chunk i, the copy engine is already moving chunk i+1. Events time
the pipeline on the device clock against the same work on one stream, and the copies and
the sums alone give the overlap to expect; every result is checked against numpy. Runs
against the daemon at SIMNPU_ADDRESS, or at the per-user socket, starting one there if none
runs (it exits by itself a few seconds after the program ends).
"""

import os

import numpy as np

import simnpu.client as npu

CHUNKS = 8
ROWS, COLS = 2048, 1024  # one chunk: 2048 rows of 1024 float32 (8 MiB)
BLOCKS = 1  # one AI core sums a chunk; the copy engine needs a CPU of its own meanwhile


def run(copy_stream, compute_stream, host, inputs, sums, row_sum, copies=True, kernels=True):
    """Queue the pipeline (or only its copies, or only its kernels); returns the events
    that bracket it."""
    start, end = npu.Event(), npu.Event()
    start.record(copy_stream)
    compute_stream.wait_event(start)
    for i in range(CHUNKS):
        if copies:
            inputs[i].copy_from_host(host[i], stream=copy_stream)  # async: pinned memory
            compute_stream.wait_event(copy_stream.record())  # the chunk has landed
        if kernels:
            row_sum.launch(BLOCKS, inputs[i], sums[i], ROWS, COLS, stream=compute_stream)
    end.record(compute_stream)
    return start, end


def timed(copy_stream, compute_stream, *work, **parts) -> float:
    """Milliseconds of device time the pipeline (or a part of it) takes."""
    start, end = run(copy_stream, compute_stream, *work, **parts)
    end.synchronize()
    # An event synchronize returns success even if a task failed (ACL_CONTINUE_ON_FAILURE):
    # the streams' synchronizes report the failed copy or kernel with its error.
    copy_stream.synchronize()
    compute_stream.synchronize()
    return start.elapsed_time(end)


def main():
    rng = np.random.default_rng(0)
    with npu.Device(0):
        copy_stream, compute_stream = npu.Stream(), npu.Stream()
        pinned = npu.PinnedBuffer(CHUNKS * ROWS * COLS * 4)
        host = pinned.array(np.float32, (CHUNKS, ROWS, COLS))
        host[:] = rng.standard_normal(host.shape, dtype=np.float32)
        inputs = [npu.DeviceBuffer(ROWS * COLS * 4) for _ in range(CHUNKS)]
        sums = [npu.DeviceBuffer(ROWS * 4) for _ in range(CHUNKS)]
        work = (host, inputs, sums, npu.builtin("reduce_sum_f32"))

        timed(compute_stream, compute_stream, *work)  # warm-up
        copies_ms = timed(copy_stream, compute_stream, *work, kernels=False)
        kernels_ms = timed(copy_stream, compute_stream, *work, copies=False)
        two_streams_ms = timed(copy_stream, compute_stream, *work)
        one_stream_ms = timed(compute_stream, compute_stream, *work)

        expected = host.sum(axis=-1)
        for i in range(CHUNKS):
            np.testing.assert_allclose(
                sums[i].to_numpy(np.float32), expected[i], rtol=1e-4, atol=1e-3
            )
        # Perfect overlap hides the shorter part behind the longer one, all but one chunk.
        ideal_ms = max(copies_ms, kernels_ms) + min(copies_ms, kernels_ms) / CHUNKS
        print(f"row sums of {CHUNKS} chunks of {ROWS}x{COLS} float32: all match numpy")
        print(f"  copies alone:                   {copies_ms:7.2f} ms (device clock)")
        print(f"  sums alone:                     {kernels_ms:7.2f} ms")
        print(f"  one stream:                     {one_stream_ms:7.2f} ms")
        print(
            f"  two streams, ordered by events: {two_streams_ms:7.2f} ms, "
            f"{one_stream_ms / two_streams_ms:.2f}x faster than one stream"
        )
        print(
            f"  expected with full overlap:     {ideal_ms:7.2f} ms, "
            f"{(copies_ms + kernels_ms) / ideal_ms:.2f}x"
        )
        if one_stream_ms / two_streams_ms < 1.1:
            print(
                "  little overlap measured: the copy engine and the AI core are processes "
                "of this machine; they overlap when each has a free CPU, and both copies and "
                f"sums share its memory bandwidth ({os.cpu_count()} CPUs, load average "
                f"{os.getloadavg()[0]:.1f})"
            )

        del host
        for buffer in inputs + sums + [pinned]:
            buffer.free()
        copy_stream.destroy()
        compute_stream.destroy()
    npu.shutdown()


if __name__ == "__main__":
    main()
