"""After the CANN runtime's example/2_advanced_features/model_ri/3_cond_model: conditional
tasks in a captured model -- IF, WHILE and SWITCH choosing among sub models by a condition
in device memory.

Each case captures a stream (THREAD_LOCAL mode), asks aclmdlRICaptureGetInfo for the model
being captured, makes a condition of it with ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT and
default value 0, records a cond task whose sub models are then captured on a second stream
(each holding out = self + alpha * other), ends the capture and replays the model after
writing a value to the condition with a synchronous copy.

The condition's flag decides what the replays do: with ASSIGN_DEFAULT the runtime sets the
condition to its default value when aclmdlRIExecuteAsync is called, after the value the
program wrote. So, as the vendor example's own output shows, every replay sees 0: the IF
runs its false branch (alpha 0.5) for both values written, the WHILE body never runs (its
output buffer keeps what the memory held: the program checks it is unchanged), and the
SWITCH runs case 0 (alpha 1.0) whatever value was written. The program checks exactly that.

The vendor example calls aclnnAdd; simnpu has no aclnn library, so built-in kernels stand in
for it: the workspace holds alpha * other (fill_f32, mul_f32), add_f32 writes the sum.
"""

import ctypes
import struct
import sys

import acl

DEVICE_ID = 0
SELF = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
OTHER = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
N = 8  # a 4 x 2 float tensor
SIZE = N * 4
MODE = acl.ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL
WORD = 8  # the condition: a uint64


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


def add(workspace, self_addr, other_addr, alpha, out_addr, stream):
    """The stand-in for aclnnAdd (async): out = self + alpha * other."""
    launch("fill_f32", struct.pack("<QfI", workspace, alpha, N), stream)
    launch("mul_f32", struct.pack("<QQQI4x", other_addr, workspace, workspace, N), stream)
    launch("add_f32", struct.pack("<QQQI4x", self_addr, workspace, out_addr, N), stream)


def write_word(pointer, value):
    data = struct.pack("<Q", value)
    check(
        acl.rt.memcpy(
            pointer, WORD, acl.util.bytes_to_ptr(data), WORD, acl.ACL_MEMCPY_HOST_TO_DEVICE
        ),
        "acl.rt.memcpy (condition)",
    )


def read(pointer):
    result = (ctypes.c_float * N)()
    check(
        acl.rt.memcpy(ctypes.addressof(result), SIZE, pointer, SIZE, acl.ACL_MEMCPY_DEVICE_TO_HOST),
        "acl.rt.memcpy",
    )
    return list(result)


def show(title, values):
    print(title)
    print("  out:", "  ".join(f"{value:.4f}" for value in values))


def expected(alpha):
    return [s + alpha * o for s, o in zip(SELF, OTHER)]


def same(values, wanted):
    return all(abs(value - want) <= 1e-4 for value, want in zip(values, wanted))


class Case:
    """The streams and buffers of one case (the vendor's tensors: self, other, dst)."""

    def __init__(self, workspaces):
        self.stream, ret = acl.rt.create_stream()
        check(ret, "acl.rt.create_stream")
        self.sub_stream, ret = acl.rt.create_stream()
        check(ret, "acl.rt.create_stream")
        self.buffers = {}
        for name in ("self", "other", "dst"):
            self.buffers[name], ret = acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
            check(ret, "acl.rt.malloc")
        for name, values in (("self", SELF), ("other", OTHER)):
            data = struct.pack(f"<{N}f", *values)
            check(
                acl.rt.memcpy(
                    self.buffers[name],
                    SIZE,
                    acl.util.bytes_to_ptr(data),
                    SIZE,
                    acl.ACL_MEMCPY_HOST_TO_DEVICE,
                ),
                "acl.rt.memcpy",
            )
        self.workspaces = []
        for _ in range(workspaces):
            workspace, ret = acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
            check(ret, "acl.rt.malloc (workspace)")
            self.workspaces.append(workspace)
        self.exec_stream = 0

    def add(self, index, alpha, stream):
        b = self.buffers
        add(self.workspaces[index], b["self"], b["other"], alpha, b["dst"], stream)

    def capture_cond(self, kind, size):
        """Begin the capture, make the condition, add the cond task: (model, condition
        pointer, sub models)."""
        check(acl.mdl.ri_capture_begin(self.stream, MODE), "acl.mdl.ri_capture_begin")
        _, parent, ret = acl.mdl.ri_capture_get_info(self.stream)
        check(ret, "acl.mdl.ri_capture_get_info")
        handle, ret = acl.mdl.ri_cond_handle_create(
            parent, 0, acl.ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT
        )
        check(ret, "acl.mdl.ri_cond_handle_create")
        pointer, ret = acl.mdl.ri_cond_handle_get_cond_ptr(handle)
        check(ret, "acl.mdl.ri_cond_handle_get_cond_ptr")
        params = {"handle": handle, "type": kind, "size": size}
        sub_models, ret = acl.mdl.ri_add_cond_task(params, self.stream, 0)
        check(ret, "acl.mdl.ri_add_cond_task")
        return parent, pointer, sub_models

    def sub_capture(self, sub_model, record):
        check(
            acl.mdl.ri_capture_to_model_ri_begin(self.sub_stream, sub_model, MODE),
            "acl.mdl.ri_capture_to_model_ri_begin",
        )
        record(self.sub_stream)
        _, ret = acl.mdl.ri_capture_end(self.sub_stream)
        check(ret, "acl.mdl.ri_capture_end (sub model)")

    def end(self):
        model, ret = acl.mdl.ri_capture_end(self.stream)
        check(ret, "acl.mdl.ri_capture_end")
        self.exec_stream, ret = acl.rt.create_stream()
        check(ret, "acl.rt.create_stream")
        return model

    def replay(self, model, pointer, value):
        write_word(pointer, value)
        check(acl.mdl.ri_execute_async(model, self.exec_stream), "acl.mdl.ri_execute_async")
        check(acl.rt.synchronize_stream(self.exec_stream), "acl.rt.synchronize_stream")
        return read(self.buffers["dst"])

    def close(self, model, extra=()):
        check(acl.mdl.ri_destroy(model), "acl.mdl.ri_destroy")
        for stream in (self.sub_stream, self.stream, self.exec_stream):
            check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")
        for pointer in (*self.buffers.values(), *extra, *self.workspaces):
            check(acl.rt.free(pointer), "acl.rt.free")


def cond_if():
    print("---- IF ----")
    case = Case(2)
    model, pointer, (when_true, when_false) = case.capture_cond(acl.ACL_MODEL_RI_COND_TYPE_IF, 2)
    case.sub_capture(when_true, lambda stream: case.add(0, 2.0, stream))
    case.sub_capture(when_false, lambda stream: case.add(1, 0.5, stream))
    model = case.end()
    wrong = 0
    for value, title in ((1, "IF, condition written 1:"), (0, "IF, condition written 0:")):
        result = case.replay(model, pointer, value)
        show(title, result)
        wrong += not same(result, expected(0.5))  # reset to 0 by the replay: the false branch
    case.close(model)
    return wrong


def cond_while():
    print("---- WHILE ----")
    case = Case(1)
    zero, ret = acl.rt.malloc(WORD, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    write_word(zero, 0)
    model, pointer, (body,) = case.capture_cond(acl.ACL_MODEL_RI_COND_TYPE_WHILE, 1)

    def record(stream):
        case.add(0, 1.0, stream)
        check(
            acl.rt.memcpy_async(pointer, WORD, zero, WORD, acl.ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
            "acl.rt.memcpy_async (condition = 0)",
        )

    case.sub_capture(body, record)
    model = case.end()
    before = read(case.buffers["dst"])
    result = case.replay(model, pointer, 1)
    show("WHILE, condition written 1:", result)
    case.close(model, (zero,))
    return int(result != before)  # reset to 0 by the replay: the body never ran


def cond_switch():
    print("---- SWITCH ----")
    alphas = (1.0, 2.0, 0.5)
    case = Case(3)
    kind = acl.ACL_MODEL_RI_COND_TYPE_SWITCH
    model, pointer, branches = case.capture_cond(kind, len(alphas))
    for index, (branch, alpha) in enumerate(zip(branches, alphas)):
        case.sub_capture(branch, lambda stream, i=index, a=alpha: case.add(i, a, stream))
    model = case.end()
    wrong = 0
    for value in range(len(alphas)):
        result = case.replay(model, pointer, value)
        show(f"SWITCH, condition written {value}:", result)
        wrong += not same(result, expected(alphas[0]))  # reset to 0 by the replay: case 0
    case.close(model)
    return wrong


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    context, ret = acl.rt.create_context(DEVICE_ID)
    check(ret, "acl.rt.create_context")
    wrong = {"IF": cond_if(), "WHILE": cond_while(), "SWITCH": cond_switch()}
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    for name, count in wrong.items():
        if count:
            print(f"[ERROR] {name}: {count} replay(s) gave another result than expected")
    if any(wrong.values()):
        sys.exit(1)
    print(
        "cond_model: every replay started from the default condition 0 -- IF ran its false "
        "branch, WHILE never ran its body, SWITCH ran case 0"
    )


if __name__ == "__main__":
    main()
