"""After the CANN runtime's example/2_advanced_features/model_ri/2_model_switch: build a model
run instance by hand from five persistent streams, with stream switching and activation.

aclmdlRIBuildBegin makes an empty model; five streams created with ACL_STREAM_PERSISTENT are
bound to it (stream 1 as the head, which runs when a replay starts; the others run only when
a task of the model activates them) and everything queued on them is recorded, not run:
stream 1 copies its inputs, adds, and copies a selector word into `num`, then switches to
stream 3 when num == 1 and to stream 4 when num == 2; streams 2 and 3 add and activate the
end stream; stream 4 activates stream 2; the end stream holds the end-of-graph task. After
aclmdlRIBuildEnd the model is replayed twice: with selector 1 (stream 3 runs, stream 2
never starts, so out2 stays 0) and then with selector 2 (stream 4 starts stream 2).

The vendor example calls aclnnAdd (out = self + alpha * other); simnpu has no aclnn
library, so built-in kernels stand in for it: the workspace holds alpha * other
(fill_f32, mul_f32) and add_f32 writes the sum. The inputs the model copies come from
pinned host memory (simnpu cannot record a copy from pageable memory into a model).
"""

import ctypes
import struct
import sys

import acl

DEVICE_ID = 0
SHAPE = (4, 2)
ALPHA = 1.2
SELF = (1.0, 2.0, 3.0)  # the self tensor of the three adds, one value each
OTHER = 2.0


def check(ret, call):
    """Stop the program (status 1) when an acl call did not succeed."""
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {call} failed with ret = {ret} ({acl.get_recent_err_msg()})")
        sys.exit(1)


def launch(name, args, stream):
    """Queue built-in kernel `name` on one block with its packed argument struct."""
    func, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, name)
    check(ret, f"acl.rt.binary_get_function({name})")
    check(
        acl.rt.launch_kernel_with_host_args(
            func, 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        ),
        f"acl.rt.launch_kernel_with_host_args({name})",
    )


def add(workspace, self_addr, other_addr, out_addr, n, stream):
    """The stand-in for aclnnAdd (async): out = self + ALPHA * other."""
    launch("fill_f32", struct.pack("<QfI", workspace, ALPHA, n), stream)
    launch("mul_f32", struct.pack("<QQQI4x", other_addr, workspace, workspace, n), stream)
    launch("add_f32", struct.pack("<QQQI4x", self_addr, workspace, out_addr, n), stream)


def malloc(size):
    addr, ret = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    return addr


def to_device(addr, data):
    """A synchronous host-to-device copy of the bytes `data`."""
    check(
        acl.rt.memcpy(
            addr, len(data), acl.util.bytes_to_ptr(data), len(data), acl.ACL_MEMCPY_HOST_TO_DEVICE
        ),
        "acl.rt.memcpy",
    )


def read_outputs(outs, size, n, stream):
    """The three outputs, copied back on `stream` (a stream no model uses)."""
    results = [(ctypes.c_float * n)() for _ in outs]
    for result, out in zip(results, outs):
        check(
            acl.rt.memcpy_async(
                ctypes.addressof(result), size, out, size, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream
            ),
            "acl.rt.memcpy_async",
        )
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    return [list(result) for result in results]


def show(results, when, expected):
    """Print the three outputs; the number of values that differ from `expected`."""
    wrong = 0
    for index, (values, want) in enumerate(zip(results, expected), 1):
        print(f"[INFO]  {when}, print data{index}.")
        print("[INFO]  The vector data is: " + "  ".join(f"{v:.4f}" for v in values))
        wrong += sum(abs(v - want) > 1e-4 for v in values)
    return wrong


def main():
    n = SHAPE[0] * SHAPE[1]
    size = n * 4
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    context, ret = acl.rt.create_context(DEVICE_ID)
    check(ret, "acl.rt.create_context")
    selfs = [malloc(size) for _ in SELF]
    others = [malloc(size) for _ in SELF]
    outs = [malloc(size) for _ in SELF]
    workspaces = [malloc(size) for _ in SELF]

    # the two values the selector is compared with, the selector and its source word
    right_one, right_two = malloc(4), malloc(4)
    to_device(right_one, struct.pack("<i", 1))
    to_device(right_two, struct.pack("<i", 2))
    num = malloc(4)
    to_device(num, struct.pack("<I", 0))
    selector = malloc(4)
    to_device(selector, struct.pack("<I", 1))

    streams = []
    for _ in range(5):  # streams 1..4 and the end stream
        stream, ret = acl.rt.create_stream_with_config(0, acl.ACL_STREAM_PERSISTENT)
        check(ret, "acl.rt.create_stream_with_config")
        streams.append(stream)
    stream1, stream2, stream3, stream4, end_stream = streams
    copy_stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")

    model, ret = acl.mdl.ri_build_begin(0)
    check(ret, "acl.mdl.ri_build_begin")
    check(
        acl.mdl.ri_bind_stream(model, stream1, acl.ACL_MODEL_STREAM_FLAG_HEAD),
        "acl.mdl.ri_bind_stream",
    )
    for stream in (stream2, stream3, stream4, end_stream):
        check(
            acl.mdl.ri_bind_stream(model, stream, acl.ACL_MODEL_STREAM_FLAG_DEFAULT),
            "acl.mdl.ri_bind_stream",
        )

    # inputs, copied by the model itself at each replay (from pinned host memory: simnpu
    # cannot record a copy from pageable memory into a model)
    pinned = []
    for values in [*[[value] * n for value in SELF], [OTHER] * n]:
        host, ret = acl.rt.malloc_host(size)
        check(ret, "acl.rt.malloc_host")
        ctypes.memmove(host, struct.pack(f"<{n}f", *values), size)
        pinned.append(host)
    for index, stream in enumerate((stream1, stream2, stream3)):
        check(
            acl.rt.memcpy_async(
                selfs[index], size, pinned[index], size, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream
            ),
            "acl.rt.memcpy_async",
        )
    for index, stream in enumerate((stream1, stream2, stream3)):
        check(
            acl.rt.memcpy_async(
                others[index], size, pinned[-1], size, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream
            ),
            "acl.rt.memcpy_async",
        )
    add(workspaces[0], selfs[0], others[0], outs[0], n, stream1)
    check(
        acl.rt.memcpy_async(num, 4, selector, 4, acl.ACL_MEMCPY_DEVICE_TO_DEVICE, stream1),
        "acl.rt.memcpy_async",
    )
    add(workspaces[1], selfs[1], others[1], outs[1], n, stream2)
    check(acl.rt.active_stream(end_stream, stream2), "acl.rt.active_stream")
    add(workspaces[2], selfs[2], others[2], outs[2], n, stream3)
    check(acl.rt.active_stream(end_stream, stream3), "acl.rt.active_stream")
    for right, target in ((right_one, stream3), (right_two, stream4)):
        check(
            acl.rt.switch_stream(
                num, acl.ACL_RT_EQUAL, right, acl.ACL_RT_SWITCH_INT32, target, 0, stream1
            ),
            "acl.rt.switch_stream",
        )
    check(acl.rt.active_stream(stream2, stream4), "acl.rt.active_stream")
    check(acl.mdl.ri_end_task(model, end_stream), "acl.mdl.ri_end_task")
    check(acl.mdl.ri_build_end(model, None), "acl.mdl.ri_build_end")

    execute_stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    sums = [value + ALPHA * OTHER for value in SELF]

    check(acl.mdl.ri_execute_async(model, execute_stream), "acl.mdl.ri_execute_async")
    check(acl.rt.synchronize_stream(execute_stream), "acl.rt.synchronize_stream")
    wrong = show(
        read_outputs(outs, size, n, copy_stream), "After executing", [sums[0], 0.0, sums[2]]
    )

    # the second replay copies 2 into num: stream 4 runs and starts stream 2
    two = struct.pack("<I", 2)
    check(
        acl.rt.memcpy_async(
            selector, 4, acl.util.bytes_to_ptr(two), 4, acl.ACL_MEMCPY_HOST_TO_DEVICE, copy_stream
        ),
        "acl.rt.memcpy_async",
    )
    check(acl.rt.synchronize_stream(copy_stream), "acl.rt.synchronize_stream")
    check(acl.mdl.ri_execute_async(model, execute_stream), "acl.mdl.ri_execute_async")
    check(acl.rt.synchronize_stream(execute_stream), "acl.rt.synchronize_stream")
    wrong += show(read_outputs(outs, size, n, copy_stream), "After second execution", sums)

    for stream in streams:
        check(acl.mdl.ri_unbind_stream(model, stream), "acl.mdl.ri_unbind_stream")
    check(acl.mdl.ri_destroy(model), "acl.mdl.ri_destroy")
    for stream in (copy_stream, execute_stream, *streams):
        check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")
    for addr in (*selfs, *others, *outs, *workspaces, num, selector, right_one, right_two):
        check(acl.rt.free(addr), "acl.rt.free")
    for host in pinned:
        check(acl.rt.free_host(host), "acl.rt.free_host")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")

    if wrong:
        print(f"[ERROR] {wrong} value(s) differ from the branches the selector chose")
        sys.exit(1)
    print("model_switch: selector 1 ran streams 1 and 3, selector 2 ran streams 1, 4 and 2")


if __name__ == "__main__":
    main()
