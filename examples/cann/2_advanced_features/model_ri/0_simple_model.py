"""After the CANN runtime's example/2_advanced_features/model_ri/0_simple_model: capture a
stream's work into a model run instance and replay it.

Between aclmdlRICaptureBegin (GLOBAL mode) and aclmdlRICaptureEnd the stream records a copy
of the input from pinned host memory and the two operators out_tmp = self + alpha * other
and out = out_tmp * other; in the middle the thread switches itself to the RELAXED capture
mode for a synchronous copy of `other` (which runs at once, so the model reads it from
device memory), then switches back. The model is written out as JSON and replayed four
times, each result read back and printed.

The vendor example calls aclnnAdd and aclnnMul; simnpu has no aclnn library, so built-in
kernels stand in for them: the add's workspace holds alpha * other (fill_f32, mul_f32),
add_f32 writes the sum, mul_f32 the product.
"""

import ctypes
import json
import os
import struct
import sys
import tempfile

import acl

DEVICE_ID = 0
SELF = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
OTHER = [2.0] * 8
ALPHA = 1.1
SHAPE = (4, 2)
LOOPS = 4


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
    """The stand-in for aclnnAdd (async): out = self + alpha * other."""
    launch("fill_f32", struct.pack("<QfI", workspace, alpha, n), stream)
    launch("mul_f32", struct.pack("<QQQI4x", other_addr, workspace, workspace, n), stream)
    launch("add_f32", struct.pack("<QQQI4x", self_addr, workspace, out_addr, n), stream)


def mul(self_addr, other_addr, out_addr, n, stream):
    """The stand-in for aclnnMul (async): out = self * other."""
    launch("mul_f32", struct.pack("<QQQI4x", self_addr, other_addr, out_addr, n), stream)


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
    add_workspace_size = size  # alpha * other
    add_workspace, ret = acl.rt.malloc(add_workspace_size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")

    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    self_host, ret = acl.rt.malloc_host(size)
    check(ret, "acl.rt.malloc_host")
    self_data = struct.pack(f"<{n}f", *SELF)
    check(
        acl.rt.memcpy(
            self_host, size, acl.util.bytes_to_ptr(self_data), size, acl.ACL_MEMCPY_HOST_TO_HOST
        ),
        "acl.rt.memcpy",
    )

    check(
        acl.mdl.ri_capture_begin(stream, acl.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
        "acl.mdl.ri_capture_begin",
    )
    check(
        acl.rt.memcpy_async(
            device["self"], size, self_host, size, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream
        ),
        "acl.rt.memcpy_async",
    )
    mode, ret = acl.mdl.ri_capture_thread_exchange_mode(acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    check(ret, "acl.mdl.ri_capture_thread_exchange_mode")
    other_data = struct.pack(f"<{n}f", *OTHER)
    check(
        acl.rt.memcpy(
            device["other"],
            size,
            acl.util.bytes_to_ptr(other_data),
            size,
            acl.ACL_MEMCPY_HOST_TO_DEVICE,
        ),
        "acl.rt.memcpy (relaxed mode, during the capture)",
    )
    mode, ret = acl.mdl.ri_capture_thread_exchange_mode(mode)
    check(ret, "acl.mdl.ri_capture_thread_exchange_mode")
    add(add_workspace, device["self"], device["other"], ALPHA, device["out_tmp"], n, stream)
    mul(device["out_tmp"], device["other"], device["out"], n, stream)
    model, ret = acl.mdl.ri_capture_end(stream)
    check(ret, "acl.mdl.ri_capture_end")

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "modelRI.json")
        check(
            acl.mdl.ri_debug_json_print(model, path, acl.ACL_MDLRI_DEBUG_JSON_PRINT_SUMMARY),
            "acl.mdl.ri_debug_json_print",
        )
        with open(path, encoding="utf-8") as dump:
            summary = json.load(dump)
    print(f"model run instance written as JSON: {summary['tasks']} tasks")

    expected = [(s + ALPHA * o) * o for s, o in zip(SELF, OTHER)]
    wrong = 0
    result = (ctypes.c_float * n)()
    for loop in range(1, LOOPS + 1):
        print(f"replay {loop} of the model")
        check(acl.mdl.ri_execute_async(model, stream), "acl.mdl.ri_execute_async")
        check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
        check(
            acl.rt.memcpy(
                ctypes.addressof(result), size, device["out"], size, acl.ACL_MEMCPY_DEVICE_TO_HOST
            ),
            "acl.rt.memcpy",
        )
        print("  out:", "  ".join(f"{value:.4f}" for value in result))
        wrong += sum(abs(value - want) > 1e-4 for value, want in zip(result, expected))

    check(acl.mdl.ri_destroy(model), "acl.mdl.ri_destroy")
    check(acl.rt.destroy_stream_force(stream), "acl.rt.destroy_stream_force")
    for addr in (*device.values(), add_workspace):
        check(acl.rt.free(addr), "acl.rt.free")
    check(acl.rt.free_host(self_host), "acl.rt.free_host")
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")

    if wrong:
        print(f"[ERROR] {wrong} value(s) differ from (self + alpha * other) * other")
        sys.exit(1)
    print("simple_model: every replay gave (self + alpha * other) * other")


if __name__ == "__main__":
    main()
