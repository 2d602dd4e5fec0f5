"""After the CANN runtime's example/1_basic_features/stream/2_multi_stream.

Two streams share one device word: a long task adds 1 on the first, a short task doubles
it on the second, and the second must not start before the first is done. The program
orders them three ways, each in a fresh context with both streams set to stop on failure:
by synchronizing the first stream from the host, by an event (recorded on the first,
waited for by the second), and by a notify (recorded on the first, waited for and reset
by the second). Each way gives (0 + 1) * 2 = 2. The first two also show a wait that gives
up: a synchronize of the stream, then of an event, with a 1000 ms timeout while a long
task (2 s) runs returns the timeout error (507046, then 507047).
"""

import struct
import sys

import acl

DEVICE = 0
WAIT_MS = 1000
KERNELS = """
import time
from simnpu import kernel

@kernel("ptr")
def long_task(ctx, x):
    time.sleep(2.0)
    word = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    word[0] += 1

@kernel("ptr")
def short_task(ctx, x):
    word = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    word[0] *= 2
"""


def check(ret, call):
    if ret != 0:
        print(f"[ERROR]  {call} returned {ret}")
        sys.exit(1)


class Setup:
    """A context on the device with two streams (stop on failure), the kernels and a
    device word holding 0."""

    def __init__(self):
        check(acl.init(), "acl.init")
        check(acl.rt.set_device(DEVICE), "acl.rt.set_device")
        self.context, ret = acl.rt.create_context(DEVICE)
        check(ret, "acl.rt.create_context")
        self.streams = []
        for _ in range(2):
            stream, ret = acl.rt.create_stream()
            check(ret, "acl.rt.create_stream")
            self.streams.append(stream)
        for stream in self.streams:
            check(
                acl.rt.set_stream_failure_mode(stream, acl.ACL_STOP_ON_FAILURE),
                "acl.rt.set_stream_failure_mode",
            )
        self.binary, ret = acl.rt.binary_load_from_data(KERNELS)
        check(ret, "acl.rt.binary_load_from_data")

    def prepare(self):
        self.word, ret = acl.rt.malloc(4, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "acl.rt.malloc")
        zero = bytes(4)
        check(acl.rt.memcpy(self.word, 4, acl.util.bytes_to_ptr(zero), 4, 1), "acl.rt.memcpy")
        print("[INFO]  Device memory ready; launching.")

    def launch(self, name, stream):
        function, ret = acl.rt.binary_get_function(self.binary, name)
        check(ret, "acl.rt.binary_get_function")
        args = struct.pack("<Q", self.word)
        check(
            acl.rt.launch_kernel_with_host_args(
                function, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
            ),
            f"acl.rt.launch_kernel_with_host_args({name})",
        )

    def answer(self):
        host = bytes(4)  # the copy fills this buffer in place, as pyACL does
        check(acl.rt.memcpy(acl.util.bytes_to_ptr(host), 4, self.word, 4, 2), "acl.rt.memcpy")
        value = struct.unpack("<I", host)[0]
        print(f"[INFO]  The answer is {value}.")
        return value

    def release(self):
        check(acl.rt.free(self.word), "acl.rt.free")
        check(acl.rt.binary_unload(self.binary), "acl.rt.binary_unload")
        for stream in self.streams:
            check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
        check(acl.rt.destroy_context(self.context), "acl.rt.destroy_context")
        check(acl.rt.reset_device_force(DEVICE), "acl.rt.reset_device_force")
        acl.finalize()
        print("[INFO]  Resources released.")


def by_stream_synchronize():
    setup = Setup()
    first, second = setup.streams
    print("[INFO]  Ordering by a stream synchronize.")
    setup.prepare()
    print("[INFO]  Long task on the first stream: num += 1.")
    setup.launch("long_task", first)
    print("[INFO]  Synchronizing the first stream.")
    check(acl.rt.synchronize_stream(first), "acl.rt.synchronize_stream")
    print("[INFO]  Short task on the second stream: num *= 2.")
    setup.launch("short_task", second)
    check(acl.rt.synchronize_stream(second), "acl.rt.synchronize_stream")
    answer = setup.answer()
    print(f"[INFO]  A synchronize that waits {WAIT_MS} ms for a long task gives up.")
    setup.launch("long_task", first)
    timed_out = acl.rt.synchronize_stream_with_timeout(first, WAIT_MS)
    print(f"[ERROR]  acl.rt.synchronize_stream_with_timeout returned {timed_out}")
    setup.release()
    return answer, timed_out


def by_event():
    setup = Setup()
    first, second = setup.streams
    event, ret = acl.rt.create_event()
    check(ret, "acl.rt.create_event")
    print("[INFO]  Ordering by an event.")
    setup.prepare()
    print("[INFO]  Long task on the first stream: num += 1.")
    setup.launch("long_task", first)
    check(acl.rt.record_event(event, first), "acl.rt.record_event")
    print("[INFO]  The second stream waits for the event.")
    check(acl.rt.stream_wait_event(second, event), "acl.rt.stream_wait_event")
    check(acl.rt.reset_event(event, second), "acl.rt.reset_event")
    print("[INFO]  Short task on the second stream: num *= 2.")
    setup.launch("short_task", second)
    check(acl.rt.record_event(event, second), "acl.rt.record_event")
    check(acl.rt.synchronize_event(event), "acl.rt.synchronize_event")
    answer = setup.answer()
    print(f"[INFO]  An event synchronize that waits {WAIT_MS} ms for a long task gives up.")
    setup.launch("long_task", first)
    check(acl.rt.record_event(event, first), "acl.rt.record_event")
    timed_out = acl.rt.synchronize_event_with_timeout(event, WAIT_MS)
    print(f"[ERROR]  acl.rt.synchronize_event_with_timeout returned {timed_out}")
    check(acl.rt.destroy_event(event), "acl.rt.destroy_event")
    setup.release()
    return answer, timed_out


def by_notify():
    setup = Setup()
    first, second = setup.streams
    notify, ret = acl.rt.create_notify(0)
    check(ret, "acl.rt.create_notify")
    print("[INFO]  Ordering by a notify.")
    setup.prepare()
    print("[INFO]  Long task on the first stream: num += 1.")
    setup.launch("long_task", first)
    check(acl.rt.record_notify(notify, first), "acl.rt.record_notify")
    print("[INFO]  The second stream waits for the notify.")
    check(acl.rt.wait_and_reset_notify(notify, second, 0), "acl.rt.wait_and_reset_notify")
    print("[INFO]  Short task on the second stream: num *= 2.")
    setup.launch("short_task", second)
    check(acl.rt.synchronize_stream(second), "acl.rt.synchronize_stream")
    answer = setup.answer()
    check(acl.rt.destroy_notify(notify), "acl.rt.destroy_notify")
    setup.release()
    return answer


def main():
    stream_answer, stream_timeout = by_stream_synchronize()
    event_answer, event_timeout = by_event()
    notify_answer = by_notify()
    got = (stream_answer, stream_timeout, event_answer, event_timeout, notify_answer)
    expected = (
        2,
        acl.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
        2,
        acl.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
        2,
    )
    if got != expected:
        print(f"[ERROR]  expected {expected}, got {got}")
        sys.exit(1)
    print("[INFO]  All three orderings gave the expected results.")


if __name__ == "__main__":
    main()
