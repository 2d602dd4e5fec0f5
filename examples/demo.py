"""The tutorial's lesson in one program: overlap copies and compute with two streams.

Chunks of a batch go host -> device on a copy stream; a compute stream waits for each
chunk's event, then runs a kernel on it. Events time the whole pipeline on the device
clock; the same work on a single stream is timed for comparison; every result is
checked against numpy. Runs against the daemon at SIMNPU_ADDRESS, starting one if none
is running (it exits by itself a few seconds after the program ends).
"""

import numpy as np

import simnpu.client as npu

CHUNKS = 8
ROWS, COLS = 1024, 1024  # one chunk: 1024 rows of 1024 float32 (4 MiB)


def run(device, copy_stream, compute_stream, host, inputs, outputs, softmax):
    """Queue the pipeline; returns the events that bracket it."""
    start, end = npu.Event(), npu.Event()
    start.record(copy_stream)
    compute_stream.wait_event(start)
    for i in range(CHUNKS):
        copied = npu.Event()
        inputs[i].copy_from_host(host[i], stream=copy_stream)  # async: pinned memory
        copied.record(copy_stream)
        compute_stream.wait_event(copied)  # the ordering the tutorial asks for
        softmax.launch(1, inputs[i], outputs[i], ROWS, COLS, stream=compute_stream)
    end.record(compute_stream)
    return start, end


def main():
    rng = np.random.default_rng(0)
    with npu.Device(0) as device:
        copy_stream, compute_stream = npu.Stream(), npu.Stream()
        pinned = npu.PinnedBuffer(CHUNKS * ROWS * COLS * 4)
        host = pinned.array(np.float32, (CHUNKS, ROWS, COLS))
        host[:] = rng.standard_normal(host.shape, dtype=np.float32)
        inputs = [npu.DeviceBuffer(ROWS * COLS * 4) for _ in range(CHUNKS)]
        outputs = [npu.DeviceBuffer(ROWS * COLS * 4) for _ in range(CHUNKS)]
        softmax = npu.builtin("softmax_f32")

        run(device, compute_stream, compute_stream, host, inputs, outputs, softmax)[
            1
        ].synchronize()  # warm-up
        start, end = run(device, copy_stream, compute_stream, host, inputs, outputs, softmax)
        end.synchronize()
        two_streams_ms = start.elapsed_time(end)
        start, end = run(device, compute_stream, compute_stream, host, inputs, outputs, softmax)
        end.synchronize()
        one_stream_ms = start.elapsed_time(end)

        expected = np.exp(host - host.max(axis=-1, keepdims=True))
        expected /= expected.sum(axis=-1, keepdims=True)
        for i in range(CHUNKS):
            result = outputs[i].to_numpy(np.float32, (ROWS, COLS))
            np.testing.assert_allclose(result, expected[i], rtol=1e-5, atol=1e-7)
        print(f"softmax of {CHUNKS} x {ROWS}x{COLS} float32 chunks, all results match numpy")
        print(
            f"  copy and compute on two streams, ordered by events: {two_streams_ms:8.2f} ms "
            "(device clock)"
        )
        print(f"  the same work on one stream:                         {one_stream_ms:8.2f} ms")

        del host
        for buffer in inputs + outputs + [pinned]:
            buffer.free()
        copy_stream.destroy()
        compute_stream.destroy()
    npu.shutdown()


if __name__ == "__main__":
    main()
