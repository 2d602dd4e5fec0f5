"""Lesson: time device work with events, not with the host clock (pyACL).

Record an event before and after the work on the same stream, synchronize the end event,
then ask for the milliseconds between the two records: the device's own clock, from the
moment the stream reached the first event to the moment it reached the second. A host
clock around the same calls also counts the launch, the wait for earlier work and the
round trip of the synchronize. Matrix products of growing size are timed both ways and
checked against numpy.

Run: python examples/acl_event_timing.py   (a daemon is started if none runs)
"""

import struct
import time

import numpy as np

import acl

SIZES = (128, 256, 512)


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        raise SystemExit(f"{what} failed: ret={ret} ({acl.get_recent_err_msg()})")


def to_device(array):
    data = np.ascontiguousarray(array).tobytes()
    ptr, ret = acl.rt.malloc(len(data), acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc")
    check(
        acl.rt.memcpy(
            ptr, len(data), acl.util.bytes_to_ptr(data), len(data), acl.ACL_MEMCPY_HOST_TO_DEVICE
        ),
        "memcpy H2D",
    )
    return ptr


def to_host(ptr, shape, dtype=np.float32):
    out = bytes(
        int(np.prod(shape)) * np.dtype(dtype).itemsize
    )  # pyACL style: copy into a bytes buffer
    check(
        acl.rt.memcpy(
            acl.util.bytes_to_ptr(out), len(out), ptr, len(out), acl.ACL_MEMCPY_DEVICE_TO_HOST
        ),
        "memcpy D2H",
    )
    return np.frombuffer(out, dtype).reshape(shape)


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "create_stream")
    matmul, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "matmul_f32")
    check(ret, "binary_get_function")
    start, ret = acl.rt.create_event_with_flag(acl.ACL_EVENT_TIME_LINE)
    check(ret, "create_event_with_flag")
    end, ret = acl.rt.create_event_with_flag(acl.ACL_EVENT_TIME_LINE)
    check(ret, "create_event_with_flag")
    rng = np.random.default_rng(1)

    print(f"{'matmul':>16s} {'device (events)':>16s} {'host clock':>12s}")
    timings = []
    for n in SIZES:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        dev_a, dev_b = to_device(a), to_device(b)
        dev_c, ret = acl.rt.malloc(n * n * 4, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "malloc")
        args = struct.pack("<QQQIII", dev_a, dev_b, dev_c, n, n, n)  # matmul_f32(a, b, c, m, k, n)

        host_start = time.perf_counter()
        check(acl.rt.record_event(start, stream), "record_event")
        check(
            acl.rt.launch_kernel_with_host_args(
                matmul, 2, stream, None, acl.util.bytes_to_ptr(args), len(args)
            ),
            "launch",
        )
        check(acl.rt.record_event(end, stream), "record_event")
        check(acl.rt.synchronize_event(end), "synchronize_event")
        host_ms = (time.perf_counter() - host_start) * 1000
        # An event synchronize returns 0 even if the kernel failed (ACL_CONTINUE_ON_FAILURE);
        # the stream's synchronize reports the kernel's error: check it before using results.
        check(acl.rt.synchronize_stream(stream), "synchronize_stream")
        device_ms, ret = acl.rt.event_elapsed_time(start, end)
        check(ret, "event_elapsed_time")

        np.testing.assert_allclose(to_host(dev_c, (n, n)), a @ b, rtol=1e-4, atol=1e-3)
        assert 0.0 < device_ms, f"elapsed time {device_ms} ms"
        timings.append((n, device_ms, host_ms))
        print(f"{f'{n}x{n}x{n}':>16s} {device_ms:13.3f} ms {host_ms:9.3f} ms")
        for ptr in (dev_a, dev_b, dev_c):
            check(acl.rt.free(ptr), "free")

    # The end record must not complete before the start record: the reverse order is an error.
    _, ret = acl.rt.event_elapsed_time(end, start)
    assert ret == acl.ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL, ret
    print(f"event_elapsed_time(end, start) returns {ret}: {acl.get_recent_err_msg()}")
    print(
        "every product matches numpy; the events time the kernel alone, the host clock adds the "
        "launch and the synchronize round trip"
    )

    check(acl.rt.destroy_event(start), "destroy_event")
    check(acl.rt.destroy_event(end), "destroy_event")
    check(acl.rt.destroy_stream(stream), "destroy_stream")
    check(acl.rt.reset_device(0), "reset_device")
    check(acl.finalize(), "acl.finalize")


if __name__ == "__main__":
    main()
