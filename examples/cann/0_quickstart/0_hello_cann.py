"""After the CANN runtime's example/0_quickstart/0_hello_cann: the smallest complete
compute loop -- initialize, pick device 0, create a stream, put two float32 vectors in
device memory, compute out = self + alpha * other on the stream, synchronize, read the
result back and release everything in reverse order.

The vendor example calls the aclnn operator library's aclnnAdd, which simnpu does not
have; its stand-ins here are simnpu's built-in kernels: the "operator" asks for a
workspace of one vector (alpha * other is computed there with fill_f32 and mul_f32) and
add_f32 writes the sum. Tensor descriptions are plain records of this program (aclnn's
aclCreateTensor / aclCreateScalar are no pyACL calls); the output buffer is wrapped in an
aclDataBuffer as the example does.
"""

import ctypes
import struct
import sys

import acl

DEVICE_ID = 0
SELF = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
OTHER = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
ALPHA = 1.0


def check(ret, call):
    """Stop the program (status 1) when an acl call did not succeed."""
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {call} failed with ret = {ret} ({acl.get_recent_err_msg()})")
        sys.exit(1)


def make_tensor(values):
    """Device memory holding `values` (float32, 1-D) and this program's description of it:
    shape, contiguous strides, data type and address."""
    data = struct.pack(f"<{len(values)}f", *values)
    addr, ret = acl.rt.malloc(len(data), acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    check(
        acl.rt.memcpy(
            addr, len(data), acl.util.bytes_to_ptr(data), len(data), acl.ACL_MEMCPY_HOST_TO_DEVICE
        ),
        "acl.rt.memcpy",
    )
    return {"shape": [len(values)], "strides": [1], "data_type": acl.ACL_FLOAT, "addr": addr}


def kernel(name):
    """A function of simnpu's built-in kernel library."""
    func, ret = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, name)
    check(ret, f"acl.rt.binary_get_function({name})")
    return func


def launch(name, args, stream):
    """Queue built-in kernel `name` on one block with its packed argument struct."""
    check(
        acl.rt.launch_kernel_with_host_args(
            kernel(name), 1, stream, None, acl.util.bytes_to_ptr(args), len(args)
        ),
        f"acl.rt.launch_kernel_with_host_args({name})",
    )


def add_workspace_size(self_tensor, other_tensor, alpha, out_tensor):
    """The stand-in for aclnnAddGetWorkspaceSize: one vector of float32 holds alpha * other."""
    if self_tensor["shape"] != other_tensor["shape"] or self_tensor["shape"] != out_tensor["shape"]:
        print("[ERROR] the add operator needs tensors of one shape")
        sys.exit(1)
    return self_tensor["shape"][0] * acl.data_type_size(acl.ACL_FLOAT)


def add(workspace, self_tensor, other_tensor, alpha, out_tensor, stream):
    """The stand-in for aclnnAdd (async): out = self + alpha * other, in stream order."""
    n = self_tensor["shape"][0]
    launch("fill_f32", struct.pack("<QfI", workspace, alpha, n), stream)
    launch("mul_f32", struct.pack("<QQQI4x", other_tensor["addr"], workspace, workspace, n), stream)
    launch(
        "add_f32",
        struct.pack("<QQQI4x", self_tensor["addr"], workspace, out_tensor["addr"], n),
        stream,
    )


def show(name, values):
    print(f"  {name + ':':8}[{', '.join(f'{v:.1f}' for v in values)}]")


def main():
    check(acl.init(), "acl.init")
    print("acl.init done")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    print(f"device {DEVICE_ID} set")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    print("stream created")

    print("inputs:")
    show("self", SELF)
    show("other", OTHER)
    print(f"  alpha:  {ALPHA:.1f}")
    self_tensor = make_tensor(SELF)
    other_tensor = make_tensor(OTHER)
    out_tensor = make_tensor([0.0] * len(SELF))

    out_size = len(SELF) * acl.data_type_size(acl.ACL_FLOAT)
    out_buffer = acl.create_data_buffer(out_tensor["addr"], out_size)
    if not out_buffer:
        print("[ERROR] acl.create_data_buffer returned no buffer")
        sys.exit(1)
    out_addr = acl.get_data_buffer_addr(out_buffer)
    if not out_addr:
        print("[ERROR] acl.get_data_buffer_addr returned no address")
        sys.exit(1)
    print(f"output data buffer created at {out_addr:#x}")

    workspace_size = add_workspace_size(self_tensor, other_tensor, ALPHA, out_tensor)
    print(f"workspace size: {workspace_size}")
    workspace = 0
    if workspace_size > 0:
        workspace, ret = acl.rt.malloc(workspace_size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "acl.rt.malloc")
        print("workspace allocated")

    add(workspace, self_tensor, other_tensor, ALPHA, out_tensor, stream)
    print("add launched")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    print("stream synchronized")

    result = (ctypes.c_float * len(SELF))()
    check(
        acl.rt.memcpy(
            ctypes.addressof(result), out_size, out_addr, out_size, acl.ACL_MEMCPY_DEVICE_TO_HOST
        ),
        "acl.rt.memcpy",
    )
    print()
    print("out = self + alpha * other:")
    wrong = 0
    for i, value in enumerate(result):
        expected = SELF[i] + ALPHA * OTHER[i]
        print(f"  result[{i}] = {value:.1f} (expected {expected:.1f})")
        if abs(value - expected) > 1e-5:
            wrong += 1

    check(acl.destroy_data_buffer(out_buffer), "acl.destroy_data_buffer")
    for addr in (self_tensor["addr"], other_tensor["addr"], out_tensor["addr"], workspace):
        if addr:
            check(acl.rt.free(addr), "acl.rt.free")
    print("device memory freed")
    check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")
    print("stream destroyed")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    print("device reset")
    check(acl.finalize(), "acl.finalize")
    print("acl.finalize done")

    if wrong:
        print(f"\n[ERROR] {wrong} result(s) differ from self + alpha * other")
        sys.exit(1)
    print("\nhello_cann: all results match")


if __name__ == "__main__":
    main()
