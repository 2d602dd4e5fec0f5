"""Device memory shared between two processes on one device, open to any process
(pyACL).

Follows the CANN runtime's example `1_basic_features/memory/11_ipc_memory_withoutpid`.
Process A allocates device memory, a kernel writes 123 into it (and prints it), and A
exports the memory by IPC key with pid validation off and hands over the key; B imports
the memory, a kernel of its prints the int it reads there, and B tells A it is done. Both
close the key. The values printed on both sides must be equal.

Unlike the Ascend device, the simulated one prints a kernel's output at the stream's
synchronize, so each process synchronizes its stream after its kernel (A before it shares
the memory, B before it says it is done).

Run: python examples/cann/1_basic_features/memory/11_ipc_memory_withoutpid.py
"""

import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import acl

DEVICE = 0
SIZE = 1024 * 1024
VALUE = 123
BLOCKS = 1
WAIT_S = 120  # how long a process waits for the other's file

KERNELS = '''
from simnpu import kernel


@kernel("ptr", "i32")
def device_write(ctx, dev_ptr, value):
    """Each block writes `value` to its int of `dev_ptr` and prints it."""
    ctx.gm(dev_ptr, "int32", ctx.block_num, access="w")[ctx.block_idx] = value
    ctx.printf("Source data: %d\\n", value)


@kernel("ptr")
def device_read(ctx, dev_ptr):
    """Each block prints its int of `dev_ptr`."""
    value = ctx.gm(dev_ptr, "int32", ctx.block_num, access="r")[ctx.block_idx]
    ctx.printf("Destination data: %d\\n", int(value))
'''


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {what} failed: ret={ret} ({acl.get_recent_err_msg()})", flush=True)
        sys.exit(1)


def send(folder, name, data):
    """Write a file for the other process, then its done flag."""
    with open(os.path.join(folder, name), "wb") as out:
        out.write(data)
    open(os.path.join(folder, name + ".done"), "w").close()


def receive(folder, name):
    """Wait for the other process's file (its done flag) and read it."""
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(os.path.join(folder, name + ".done")):
        if time.monotonic() > deadline:
            print(f"[ERROR] gave up waiting for {name}", flush=True)
            sys.exit(1)
        time.sleep(0.05)
    with open(os.path.join(folder, name), "rb") as source:
        return source.read()


def launch(name, stream, fmt, *args):
    """Launch kernel `name` of KERNELS on `stream` with the packed arguments."""
    binary, ret = acl.rt.binary_load_from_data(KERNELS)
    check(ret, "acl.rt.binary_load_from_data")
    function, ret = acl.rt.binary_get_function(binary, name)
    check(ret, "acl.rt.binary_get_function")
    packed = struct.pack(fmt, *args)
    check(
        acl.rt.launch_kernel_with_host_args(
            function, BLOCKS, stream, None, acl.util.bytes_to_ptr(packed), len(packed)
        ),
        f"launch of {name}",
    )


def process_a(folder):
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    dev_ptr, ret = acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    print(f"[INFO] A: allocated device memory at {dev_ptr:#x}", flush=True)
    launch("device_write", stream, "<Qi", dev_ptr, VALUE)
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    print(f"[INFO] A: wrote {VALUE} at {dev_ptr:#x}", flush=True)
    mem_key, ret = acl.rt.ipc_mem_get_export_key(
        dev_ptr, SIZE, acl.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
    )
    check(ret, "acl.rt.ipc_mem_get_export_key")
    print(f"[INFO] A: the memory's IPC key is {mem_key}", flush=True)
    send(folder, "mem_key", mem_key.encode())
    (done,) = struct.unpack("<i", receive(folder, "done"))
    print(f"[INFO] A: process B says it is done ({done})", flush=True)
    check(acl.rt.ipc_mem_close(mem_key), "acl.rt.ipc_mem_close")
    acl.rt.destroy_stream_force(stream)
    acl.rt.free(dev_ptr)
    acl.rt.reset_device_force(DEVICE)
    acl.finalize()


def process_b(folder):
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    mem_key = receive(folder, "mem_key").decode()
    print(f"[INFO] B: got the memory's IPC key {mem_key}", flush=True)
    dev_ptr, ret = acl.rt.ipc_mem_import_by_key(mem_key, 0)
    check(ret, "acl.rt.ipc_mem_import_by_key")
    launch("device_read", stream, "<Q", dev_ptr)
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    send(folder, "done", struct.pack("<i", 1))
    print("[INFO] B: done with the shared memory", flush=True)
    check(acl.rt.ipc_mem_close(mem_key), "acl.rt.ipc_mem_close")
    acl.rt.destroy_stream_force(stream)
    acl.rt.free(dev_ptr)  # not this process's allocation: its code is not checked
    acl.rt.reset_device_force(DEVICE)
    acl.finalize()


def printed(log, label):
    """The value after the first `label:` line of `log`, or None."""
    found = re.search(rf"^{label}: *(\S+)", log, re.MULTILINE)
    return found.group(1) if found else None


def main():
    with tempfile.TemporaryDirectory(prefix="ipc-memory-open-") as folder:
        roles = [
            subprocess.Popen(
                [sys.executable, __file__, role, folder],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for role in ("a", "b")
        ]
        try:
            logs = [role.communicate(timeout=4 * WAIT_S)[0] for role in roles]
        finally:
            for role in roles:
                if role.poll() is None:
                    role.kill()
                    role.wait()
    for log in reversed(logs):
        print(log, end="")
    source, destination = printed(logs[0], "Source data"), printed(logs[1], "Destination data")
    if all(role.returncode == 0 for role in roles) and source and source == destination:
        print(f"[SUCCESS] the memory was shared: both sides saw {source}")
        return 0
    print(f"[FAILURE] the source saw {source}, the destination {destination}")
    return 1


if __name__ == "__main__":
    if len(sys.argv) == 3:
        {"a": process_a, "b": process_b}[sys.argv[1]](sys.argv[2])
    else:
        sys.exit(main())
