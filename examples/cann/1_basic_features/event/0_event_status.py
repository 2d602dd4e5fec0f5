"""After the CANN runtime's example/1_basic_features/event/0_event_status.

An event's recorded status as it moves: 0 (not complete) right after it is created, still
0 after it is recorded behind a long task (2 s) that has not finished, and 1 (complete)
once synchronize_event has waited for that record. The long task adds 1 to a device word,
so the answer is 1.
"""

import struct
import sys

import acl

DEVICE = 0
KERNELS = """
import time
from simnpu import kernel

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


def status_of(event):
    status, ret = acl.rt.query_event_status(event)
    check(ret, "acl.rt.query_event_status")
    return status


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
    event, ret = acl.rt.create_event()
    check(ret, "acl.rt.create_event")

    created = status_of(event)
    print(f"[INFO]  Status of the new event: {created}.")

    word, ret = acl.rt.malloc(4, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    zero = bytes(4)
    check(acl.rt.memcpy(word, 4, acl.util.bytes_to_ptr(zero), 4, 1), "acl.rt.memcpy(H2D)")
    print("[INFO]  Device memory ready; launching.")
    binary, ret = acl.rt.binary_load_from_data(KERNELS)
    check(ret, "acl.rt.binary_load_from_data")
    long_task, ret = acl.rt.binary_get_function(binary, "long_task")
    check(ret, "acl.rt.binary_get_function")
    print("[INFO]  A long task, then a record of the event.")
    args = struct.pack("<Q", word)
    check(
        acl.rt.launch_kernel_with_host_args(
            long_task, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        ),
        "acl.rt.launch_kernel_with_host_args",
    )
    check(acl.rt.record_event(event, stream), "acl.rt.record_event")

    recorded = status_of(event)
    print("[INFO]  (0: not complete, 1: complete)")
    print(f"[INFO]  Status after the record, before any synchronize: {recorded}.")
    check(acl.rt.synchronize_event(event), "acl.rt.synchronize_event")
    synchronized = status_of(event)
    print(f"[INFO]  Status after synchronize_event: {synchronized}.")
    host = bytes(4)  # the copy fills this buffer in place, as pyACL does
    check(acl.rt.memcpy(acl.util.bytes_to_ptr(host), 4, word, 4, 2), "acl.rt.memcpy(D2H)")
    answer = struct.unpack("<I", host)[0]
    print(f"[INFO]  The answer is {answer}.")

    check(acl.rt.free(word), "acl.rt.free")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")
    check(acl.rt.destroy_event(event), "acl.rt.destroy_event")
    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE), "acl.rt.reset_device_force")
    acl.finalize()
    print("[INFO]  Resources released.")

    got = (created, recorded, synchronized, answer)
    not_ready = acl.ACL_EVENT_RECORDED_STATUS_NOT_READY
    expected = (not_ready, not_ready, acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 1)
    if got != expected:
        print(f"[ERROR]  expected {expected}, got {got}")
        sys.exit(1)
    print("[INFO]  The event statuses are as expected.")


if __name__ == "__main__":
    main()
