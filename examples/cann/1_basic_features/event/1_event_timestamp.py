"""After the CANN runtime's example/1_basic_features/event/1_event_timestamp.

Timing device work with two events recorded around it: event_get_timestamp gives when each
record ran on the device clock (microseconds) and event_elapsed_time the milliseconds
between them. First a short task (doubles a word holding 0: the answer is 0), then, with
the same events recorded again, a long task (2 s, adds 1: the answer is 1), which takes
about 2000 ms. The end never comes before the start.
"""

import struct
import sys

import acl

DEVICE = 0
KERNELS = """
import time
from simnpu import kernel

@kernel("ptr")
def short_task(ctx, x):
    word = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    word[0] *= 2

@kernel("ptr")
def long_task(ctx, x):
    time.sleep(2.0)
    word = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    word[0] += 1
"""


def check(ret, call):
    if ret != 0:
        print(f"[ERROR]  {call} returned {ret}")
        sys.exit(1)


def timed(binary, name, stream, start, end):
    """Run kernel `name` on a new word holding 0 between records of `start` and `end`:
    (the word afterwards, start and end timestamps in us, elapsed ms)."""
    word, ret = acl.rt.malloc(4, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    zero = bytes(4)
    check(acl.rt.memcpy(word, 4, acl.util.bytes_to_ptr(zero), 4, 1), "acl.rt.memcpy(H2D)")
    function, ret = acl.rt.binary_get_function(binary, name)
    check(ret, "acl.rt.binary_get_function")
    kind = name.split("_")[0]
    print(f"[INFO]  A {kind} task between two event records.")
    check(acl.rt.record_event(start, stream), "acl.rt.record_event(start)")
    args = struct.pack("<Q", word)
    check(
        acl.rt.launch_kernel_with_host_args(
            function, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        ),
        "acl.rt.launch_kernel_with_host_args",
    )
    check(acl.rt.record_event(end, stream), "acl.rt.record_event(end)")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    host = bytes(4)  # the copy fills this buffer in place, as pyACL does
    check(acl.rt.memcpy(acl.util.bytes_to_ptr(host), 4, word, 4, 2), "acl.rt.memcpy(D2H)")
    answer = struct.unpack("<I", host)[0]
    print(f"[INFO]  After the {kind} task the answer is {answer}.")
    print("[INFO]  Synchronized; reading the times.")
    began, ret = acl.rt.event_get_timestamp(start)
    check(ret, "acl.rt.event_get_timestamp(start)")
    print(f"[INFO]  Start event timestamp: {began} us.")
    ended, ret = acl.rt.event_get_timestamp(end)
    check(ret, "acl.rt.event_get_timestamp(end)")
    print(f"[INFO]  End event timestamp: {ended} us.")
    elapsed, ret = acl.rt.event_elapsed_time(start, end)
    check(ret, "acl.rt.event_elapsed_time")
    print(f"[INFO]  The {kind} task took {elapsed:f} ms.")
    check(acl.rt.free(word), "acl.rt.free")
    return answer, began, ended, elapsed


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE), "acl.rt.set_device")
    context, ret = acl.rt.create_context(DEVICE)
    check(ret, "acl.rt.create_context")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    check(
        acl.rt.set_stream_failure_mode(stream, acl.ACL_STOP_ON_FAILURE), "set_stream_failure_mode"
    )
    start, ret = acl.rt.create_event()
    check(ret, "acl.rt.create_event(start)")
    end, ret = acl.rt.create_event()
    check(ret, "acl.rt.create_event(end)")
    binary, ret = acl.rt.binary_load_from_data(KERNELS)
    check(ret, "acl.rt.binary_load_from_data")

    short = timed(binary, "short_task", stream, start, end)
    long = timed(binary, "long_task", stream, start, end)

    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")
    check(acl.rt.destroy_event(start), "acl.rt.destroy_event(start)")
    check(acl.rt.destroy_event(end), "acl.rt.destroy_event(end)")
    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE), "acl.rt.reset_device_force")
    acl.finalize()
    print("[INFO]  Resources released.")

    wrong = []
    if (short[0], long[0]) != (0, 1):
        wrong.append(f"answers {short[0]}, {long[0]} (expected 0, 1)")
    for answer, began, ended, elapsed in (short, long):
        if not 0 < began <= ended or elapsed < 0:
            wrong.append(f"times {began} .. {ended} us, {elapsed} ms")
    if long[3] < 2000.0 or long[2] - long[1] < 2_000_000:
        wrong.append(f"the 2 s task measured {long[3]} ms")
    if wrong:
        print(f"[ERROR]  {'; '.join(wrong)}")
        sys.exit(1)
    print("[INFO]  The event times are as expected.")


if __name__ == "__main__":
    main()
