"""Two processes on two devices synchronized by a shared notify, its import limited to a
whitelisted process (pyACL).

Follows the CANN runtime's example `2_advanced_features/notify/0_ipc_notify_withpid`.
Process A (device 2) allocates device memory and shares it by IPC key, creates a notify,
exports it (pid validation on), whitelists process B's pid, queues a wait for the notify
and, behind it, a kernel that prints the int it reads from the memory. Process B
(device 3) imports the memory and the notify, works for a moment, then a kernel of its
writes 123 into the memory and it records the notify: A's stream goes on and reads 123.
The values printed on both sides must be equal.

Unlike the Ascend device, the simulated one prints a kernel's output at the stream's
synchronize, so process B synchronizes its stream after the record (A does anyway).

Run: python examples/cann/2_advanced_features/notify/0_ipc_notify_withpid.py
(with a daemon of at least four devices: `simnpu serve --devices 4`).
"""

import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import acl

DEVICE_A, DEVICE_B = 2, 3
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
    check(acl.rt.set_device(DEVICE_A), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    can, ret = acl.rt.device_can_access_peer(DEVICE_A, DEVICE_B)
    check(ret, "acl.rt.device_can_access_peer")
    if can == 1:
        check(acl.rt.device_enable_peer_access(DEVICE_B, 0), "acl.rt.device_enable_peer_access")
        print(f"[INFO] A: device {DEVICE_A} may now reach device {DEVICE_B}", flush=True)
        dev_ptr, ret = acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "acl.rt.malloc")
        mem_key, ret = acl.rt.ipc_mem_get_export_key(
            dev_ptr, SIZE, acl.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
        )
        check(ret, "acl.rt.ipc_mem_get_export_key")
        print(f"[INFO] A: the memory's IPC key is {mem_key}", flush=True)
        send(folder, "mem_key", mem_key.encode())
        notify, ret = acl.rt.create_notify(0)
        check(ret, "acl.rt.create_notify")
        notify_key, ret = acl.rt.notify_get_export_key(notify, 0)
        check(ret, "acl.rt.notify_get_export_key")
        print(f"[INFO] A: the notify's IPC key is {notify_key}", flush=True)
        (pid,) = struct.unpack("<i", receive(folder, "pid"))
        print(f"[INFO] A: process B's pid is {pid}", flush=True)
        check(acl.rt.notify_set_import_pid(notify, [pid]), "acl.rt.notify_set_import_pid")
        print("[INFO] A: process B may import the notify", flush=True)
        send(folder, "notify_key", notify_key.encode())
        check(acl.rt.wait_and_reset_notify(notify, stream, 0), "acl.rt.wait_and_reset_notify")
        launch("device_read", stream, "<Q", dev_ptr)  # runs once B recorded the notify
        check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
        check(acl.rt.ipc_mem_close(mem_key), "acl.rt.ipc_mem_close")
        check(acl.rt.free(dev_ptr), "acl.rt.free")
        check(acl.rt.destroy_notify(notify), "acl.rt.destroy_notify")
    else:
        print("[ERROR] A: the two devices cannot reach each other", flush=True)
    acl.rt.destroy_stream_force(stream)
    acl.rt.reset_device_force(DEVICE_A)
    acl.finalize()


def process_b(folder):
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_B), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    can, ret = acl.rt.device_can_access_peer(DEVICE_B, DEVICE_A)
    check(ret, "acl.rt.device_can_access_peer")
    if can == 1:
        check(acl.rt.device_enable_peer_access(DEVICE_A, 0), "acl.rt.device_enable_peer_access")
        print(f"[INFO] B: device {DEVICE_B} may now reach device {DEVICE_A}", flush=True)
        mem_key = receive(folder, "mem_key").decode()
        print(f"[INFO] B: got the memory's IPC key {mem_key}", flush=True)
        dev_ptr, ret = acl.rt.ipc_mem_import_by_key(mem_key, 0)
        check(ret, "acl.rt.ipc_mem_import_by_key")
        pid, ret = acl.rt.device_get_bare_tgid()
        check(ret, "acl.rt.device_get_bare_tgid")
        print(f"[INFO] B: my pid is {pid}", flush=True)
        send(folder, "pid", struct.pack("<i", pid))
        notify_key = receive(folder, "notify_key").decode()
        print(f"[INFO] B: got the notify's IPC key {notify_key}", flush=True)
        notify, ret = acl.rt.notify_import_by_key(notify_key, 0)
        check(ret, "acl.rt.notify_import_by_key")
        time.sleep(0.5)  # a task that takes a while
        launch("device_write", stream, "<Qi", dev_ptr, VALUE)
        print(f"[INFO] B: writing {VALUE} to the device memory at {dev_ptr:#x}", flush=True)
        check(acl.rt.record_notify(notify, stream), "acl.rt.record_notify")
        check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
        check(acl.rt.ipc_mem_close(mem_key), "acl.rt.ipc_mem_close")
        check(acl.rt.destroy_notify(notify), "acl.rt.destroy_notify")
    else:
        print("[ERROR] B: the two devices cannot reach each other", flush=True)
    acl.rt.destroy_stream_force(stream)
    acl.rt.reset_device_force(DEVICE_B)
    acl.finalize()


def printed(log, label):
    """The value after the first `label:` line of `log`, or None."""
    found = re.search(rf"^{label}: *(\S+)", log, re.MULTILINE)
    return found.group(1) if found else None


def main():
    with tempfile.TemporaryDirectory(prefix="ipc-notify-") as folder:
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
    for log in logs:
        print(log, end="")
    source, destination = printed(logs[1], "Source data"), printed(logs[0], "Destination data")
    if all(role.returncode == 0 for role in roles) and source and source == destination:
        print(f"[SUCCESS] the notify synchronized the two processes: both sides saw {source}")
        return 0
    print(f"[FAILURE] the source saw {source}, the destination {destination}")
    return 1


if __name__ == "__main__":
    if len(sys.argv) == 3:
        {"a": process_a, "b": process_b}[sys.argv[1]](sys.argv[2])
    else:
        sys.exit(main())
