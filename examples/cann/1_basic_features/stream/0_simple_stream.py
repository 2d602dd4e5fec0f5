"""After the CANN runtime's example/1_basic_features/stream/0_simple_stream.

Work on the default stream (stream 0, made with the context) and on a stream of one's own
(set to stop on failure): a one-block kernel adds 1 to a device word on each, then 3000
more launches queue on the created stream without a synchronize between them -- a stream
runs its tasks in order -- and one synchronize waits for all of them. Expected: 1, 2,
stream status 0 (complete), 3002.
"""

import struct
import sys

import acl

DEVICE = 0
LAUNCHES = 3000
KERNELS = """
from simnpu import kernel

@kernel("ptr")
def add_one(ctx, x):
    word = ctx.gm(x + 4 * ctx.block_idx, "uint32", 1)
    word[0] += 1
"""


def check(ret, call):
    if ret != 0:
        print(f"[ERROR]  {call} returned {ret}")
        sys.exit(1)


def read_word(ptr):
    host = bytes(4)  # the copy fills this buffer in place, as pyACL does
    check(acl.rt.memcpy(acl.util.bytes_to_ptr(host), 4, ptr, 4, 2), "acl.rt.memcpy(D2H)")
    return struct.unpack("<I", host)[0]


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE), "acl.rt.set_device")
    context, ret = acl.rt.create_context(DEVICE)
    check(ret, "acl.rt.create_context")
    binary, ret = acl.rt.binary_load_from_data(KERNELS)
    check(ret, "acl.rt.binary_load_from_data")
    add_one, ret = acl.rt.binary_get_function(binary, "add_one")
    check(ret, "acl.rt.binary_get_function")

    print("[INFO]  Running a task on the default stream.")
    word, ret = acl.rt.malloc(4, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    zero = bytes(4)
    check(acl.rt.memcpy(word, 4, acl.util.bytes_to_ptr(zero), 4, 1), "acl.rt.memcpy(H2D)")
    print("[INFO]  Device memory ready; launching.")
    args = struct.pack("<Q", word)

    def launch(stream):
        check(
            acl.rt.launch_kernel_with_host_args(
                add_one, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
            ),
            "acl.rt.launch_kernel_with_host_args",
        )

    launch(0)  # 0: the context's default stream
    check(acl.rt.synchronize_stream(0), "acl.rt.synchronize_stream(default)")
    first = read_word(word)
    print(f"[INFO]  Result after the default stream's task: {first}.")

    print("[INFO]  Running a task on a created stream.")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    check(
        acl.rt.set_stream_failure_mode(stream, acl.ACL_STOP_ON_FAILURE), "set_stream_failure_mode"
    )
    launch(stream)
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    second = read_word(word)
    print(f"[INFO]  Result after the created stream's task: {second}.")

    print(f"[INFO]  Queuing {LAUNCHES} tasks on the created stream.")
    for _ in range(LAUNCHES):
        launch(stream)  # in order on one stream: no synchronize between them
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    status, ret = acl.rt.stream_query(stream)
    check(ret, "acl.rt.stream_query")
    print(f"[INFO]  Stream status after the synchronize: {status}.")
    last = read_word(word)
    print(f"[INFO]  Result after the loop: {last}.")

    check(acl.rt.free(word), "acl.rt.free")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")
    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    print("[INFO]  Resources released.")

    expected = (1, 2, acl.ACL_STREAM_STATUS_COMPLETE, LAUNCHES + 2)
    if (first, second, status, last) != expected:
        print(f"[ERROR]  expected {expected}, got {(first, second, status, last)}")
        sys.exit(1)
    print("[INFO]  All results are as expected.")


if __name__ == "__main__":
    main()
