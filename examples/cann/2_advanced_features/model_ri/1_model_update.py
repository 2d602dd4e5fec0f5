"""After the CANN runtime's example/2_advanced_features/model_ri/1_model_update: change a task
of a captured model run instance without capturing it again.

The model computes out_tmp = self + alpha * other, then out = out_tmp + alpha * other; the
second operator is captured inside a task group, behind a wait for an event created with
ACL_EVENT_EXTERNAL (and a reset of it). The model is replayed twice; before the second replay
reaches the group, an update stream launches the same operator with alpha replaced by
update_alpha between ri_capture_task_update_begin and _end, then records the event that lets
the replay go on. Each replay's result is read back and printed:
    replay 1: self + 2 * alpha * other
    replay 2: self + alpha * other + update_alpha * other

The vendor example calls aclnnAdd; simnpu has no aclnn library, so built-in kernels stand in
for it: the operator's workspace holds alpha * other (fill_f32, mul_f32) and add_f32 writes
the sum. The task group holds those three kernels, and the update launches the same three.
"""

import ctypes
import struct
import sys

import acl

DEVICE_ID = 0
SELF = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
OTHER = [2.0] * 8
ALPHA = 1.1
UPDATE_ALPHA = 2.2
SHAPE = (4, 2)
LOOPS = 2


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


def add(workspace, self_addr, other_addr, alpha, out_addr, n, stream):
    """The stand-in for aclnnAdd (async): out = self + alpha * other, three kernels."""
    launch("fill_f32", struct.pack("<QfI", workspace, alpha, n), stream)
    launch("mul_f32", struct.pack("<QQQI4x", other_addr, workspace, workspace, n), stream)
    launch("add_f32", struct.pack("<QQQI4x", self_addr, workspace, out_addr, n), stream)


def to_device(device_addr, values, size):
    """Synchronous host-to-device copy of a list of floats."""
    data = struct.pack(f"<{len(values)}f", *values)
    check(
        acl.rt.memcpy(
            device_addr, size, acl.util.bytes_to_ptr(data), size, acl.ACL_MEMCPY_HOST_TO_DEVICE
        ),
        "acl.rt.memcpy",
    )


def main():
    n = SHAPE[0] * SHAPE[1]
    size = n * 4
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    context, ret = acl.rt.create_context(DEVICE_ID)
    check(ret, "acl.rt.create_context")
    device = {}
    for name in ("self", "other", "out", "out_tmp"):
        device[name], ret = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "acl.rt.malloc")
    workspaces = {}  # one per operator call: alpha * other
    for name in ("first_add", "second_add", "update_add"):
        workspaces[name], ret = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "acl.rt.malloc")

    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    event, ret = acl.rt.create_event_with_flag(acl.ACL_EVENT_EXTERNAL)
    check(ret, "acl.rt.create_event_with_flag(ACL_EVENT_EXTERNAL)")

    check(
        acl.mdl.ri_capture_begin(stream, acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED),
        "acl.mdl.ri_capture_begin",
    )
    to_device(device["self"], SELF, size)  # relaxed mode: these run at once
    to_device(device["other"], OTHER, size)
    add(
        workspaces["first_add"],
        device["self"],
        device["other"],
        ALPHA,
        device["out_tmp"],
        n,
        stream,
    )
    # the replay stops here until the update stream records the event, so the group's
    # tasks run as the update left them
    check(acl.rt.stream_wait_event(stream, event), "acl.rt.stream_wait_event")
    check(acl.rt.reset_event(event, stream), "acl.rt.reset_event")
    check(acl.mdl.ri_capture_task_grp_begin(stream), "acl.mdl.ri_capture_task_grp_begin")
    add(
        workspaces["second_add"],
        device["out_tmp"],
        device["other"],
        ALPHA,
        device["out"],
        n,
        stream,
    )
    group, ret = acl.mdl.ri_capture_task_grp_end(stream)
    check(ret, "acl.mdl.ri_capture_task_grp_end")
    model, ret = acl.mdl.ri_capture_end(stream)
    check(ret, "acl.mdl.ri_capture_end")

    update_stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    expected = [
        [s + ALPHA * o + ALPHA * o for s, o in zip(SELF, OTHER)],
        [s + ALPHA * o + UPDATE_ALPHA * o for s, o in zip(SELF, OTHER)],
    ]
    wrong = 0
    result = (ctypes.c_float * n)()
    for loop in range(LOOPS):
        print(f"replay {loop + 1} of the model")
        check(acl.mdl.ri_execute_async(model, stream), "acl.mdl.ri_execute_async")
        if loop == 1:
            # the group's kernels are replaced by as many of the same kinds
            check(
                acl.mdl.ri_capture_task_update_begin(update_stream, group),
                "acl.mdl.ri_capture_task_update_begin",
            )
            add(
                workspaces["update_add"],
                device["out_tmp"],
                device["other"],
                UPDATE_ALPHA,
                device["out"],
                n,
                update_stream,
            )
            print(f"  the task group's add now uses alpha = {UPDATE_ALPHA}")
            check(
                acl.mdl.ri_capture_task_update_end(update_stream),
                "acl.mdl.ri_capture_task_update_end",
            )
        check(acl.rt.record_event(event, update_stream), "acl.rt.record_event")
        check(acl.rt.synchronize_stream(update_stream), "acl.rt.synchronize_stream")
        check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
        check(
            acl.rt.memcpy(
                ctypes.addressof(result), size, device["out"], size, acl.ACL_MEMCPY_DEVICE_TO_HOST
            ),
            "acl.rt.memcpy",
        )
        print("  out:", "  ".join(f"{value:.4f}" for value in result))
        wrong += sum(abs(value - want) > 1e-4 for value, want in zip(result, expected[loop]))

    check(acl.mdl.ri_destroy(model), "acl.mdl.ri_destroy")
    check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")
    check(acl.rt.destroy_stream(update_stream), "acl.rt.destroy_stream")
    for addr in (*device.values(), *workspaces.values()):
        check(acl.rt.free(addr), "acl.rt.free")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")

    if wrong:
        print(f"[ERROR] {wrong} value(s) differ from the expected sums")
        sys.exit(1)
    print("model_update: the update changed the replay it was made for and left the first alone")


if __name__ == "__main__":
    main()
