"""Lesson: asynchronous copies are asynchronous only from pinned memory (pyACL).

acl.rt.malloc_host returns page-locked ("pinned") host memory that the copy engines read
directly: acl.rt.memcpy_async from it queues the copy and returns at once, and the source
must stay untouched until the stream has run the copy. From ordinary (pageable) memory
-- a bytes object, a numpy array -- the bytes must first be staged, so memcpy_async
returns only once they have left the source: the call waits for the stream to reach the
copy, and the source may be reused as soon as it returns.

To show this without depending on timing, a host function queued first holds the stream
for HOLD_S seconds: the copy from pinned memory returns before the hold ends, the copy
from pageable memory after it. Both copies are then timed on an idle stream, and the
data are checked on the way back.

Run: python examples/acl_pinned_vs_pageable.py   (a daemon is started if none runs)
"""

import ctypes
import threading
import time

import numpy as np

import acl

NBYTES = 16 << 20
HOLD_S = 0.3


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        raise SystemExit(f"{what} failed: ret={ret} ({acl.get_recent_err_msg()})")


def shares_memory_with_the_daemon():
    """simnpu-specific: False for a client that cannot map the daemon's shared memory (another
    container, SIMNPU_NO_SHM=1): its pinned memory is private and copies from it are staged."""
    from simnpu.client import device

    return device.runtime().memory.uses_shared_memory


def held_copy(stream, dst, src):
    """Queue a hold, then an H2D memcpy_async from src; (did the call return during the hold,
    seconds the call took)."""
    released = threading.Event()
    check(
        acl.rt.launch_host_func(stream, lambda _: time.sleep(HOLD_S) or released.set(), None),
        "launch_host_func",
    )
    begin = time.perf_counter()
    check(
        acl.rt.memcpy_async(dst, NBYTES, src, NBYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream),
        "memcpy_async H2D",
    )
    call_s = time.perf_counter() - begin
    returned_during_hold = not released.is_set()
    check(acl.rt.synchronize_stream(stream), "synchronize_stream")
    return returned_during_hold, call_s


def timed_copy(stream, dst, src, start, end):
    """(seconds the call took, milliseconds on the device clock) of an H2D copy on an idle
    stream."""
    check(acl.rt.record_event(start, stream), "record_event")
    begin = time.perf_counter()
    check(
        acl.rt.memcpy_async(dst, NBYTES, src, NBYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream),
        "memcpy_async H2D",
    )
    call_s = time.perf_counter() - begin
    check(acl.rt.record_event(end, stream), "record_event")
    check(acl.rt.synchronize_stream(stream), "synchronize_stream")
    device_ms, ret = acl.rt.event_elapsed_time(start, end)
    check(ret, "event_elapsed_time")
    return call_s, device_ms


def read_back(dev):
    out = bytes(NBYTES)
    check(
        acl.rt.memcpy(
            acl.util.bytes_to_ptr(out), NBYTES, dev, NBYTES, acl.ACL_MEMCPY_DEVICE_TO_HOST
        ),
        "memcpy D2H",
    )
    return np.frombuffer(out, np.uint8)


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "create_stream")
    start, ret = acl.rt.create_event()
    check(ret, "create_event")
    end, ret = acl.rt.create_event()
    check(ret, "create_event")
    dev, ret = acl.rt.malloc(NBYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "malloc")

    data = np.random.default_rng(2).integers(0, 256, NBYTES, dtype=np.uint8)
    pinned, ret = acl.rt.malloc_host(NBYTES)
    check(ret, "malloc_host")
    pinned_view = np.frombuffer((ctypes.c_char * NBYTES).from_address(pinned), np.uint8)
    pinned_view[:] = data
    pageable = data.tobytes()  # ordinary process memory
    pageable_ptr = acl.util.bytes_to_ptr(pageable)

    rows = []
    for label, src in (("pinned (malloc_host)", pinned), ("pageable (bytes_to_ptr)", pageable_ptr)):
        check(acl.rt.memset(dev, NBYTES, 0, NBYTES), "memset")
        during_hold, held_s = held_copy(stream, dev, src)
        np.testing.assert_array_equal(read_back(dev), data)
        call_s, device_ms = timed_copy(stream, dev, src, start, end)
        np.testing.assert_array_equal(read_back(dev), data)
        rows.append((label, during_hold, held_s, call_s, device_ms))

    print(
        f"host -> device memcpy_async of {NBYTES >> 20} MiB; "
        f"the stream is first held for {HOLD_S} s"
    )
    print(
        f"{'source':26s} {'returned':>16s} {'call, held':>11s} {'call, idle':>11s} {'device':>10s}"
    )
    for label, during_hold, held_s, call_s, device_ms in rows:
        when = "during the hold" if during_hold else "after the hold"
        print(
            f"{label:26s} {when:>16s} {held_s * 1000:8.2f} ms {call_s * 1000:8.2f} ms "
            f"{device_ms:7.2f} ms"
        )
    assert not rows[1][1], (
        "the copy from pageable memory should return only once its bytes have left"
    )
    if shares_memory_with_the_daemon():
        assert rows[0][1], "the copy from pinned memory should return before the stream reaches it"
        print(
            "the data arrived intact both ways; "
            "only the pinned copy let the host go on while it was queued"
        )
    else:
        print(
            "the data arrived intact both ways; this client does not share memory with the daemon, "
            "so its pinned memory is staged like pageable memory"
        )

    del pinned_view
    check(acl.rt.free_host(pinned), "free_host")
    check(acl.rt.free(dev), "free")
    check(acl.rt.destroy_event(start), "destroy_event")
    check(acl.rt.destroy_event(end), "destroy_event")
    check(acl.rt.destroy_stream(stream), "destroy_stream")
    check(acl.rt.reset_device(0), "reset_device")
    check(acl.finalize(), "acl.finalize")


if __name__ == "__main__":
    main()
