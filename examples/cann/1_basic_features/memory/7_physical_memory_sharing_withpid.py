"""Physical device memory shared between two processes on one device, its import limited
to a whitelisted process (pyACL).

Follows the CANN runtime's example `1_basic_features/memory/7_physical_memory_sharing_withpid`.
Process A allocates physical memory (aclrtMallocPhysical, the size the allocation
granularity), maps it at a reserved address (aclrtReserveMemAddress, aclrtMapMem,
aclrtMemSetAccess), a kernel writes 123 there (and prints it), and A exports the physical
memory as a shareable handle; process B gives A its pid, A whitelists it and hands over
the handle; B imports it, maps it at an address of its own, a kernel of its prints the int
it reads there, B copies it to the host too and tells A it is done. Both unmap, release
and free. The values printed on both sides must be equal.

Unlike the Ascend device, the simulated one prints a kernel's output at the stream's
synchronize, so each process synchronizes its stream after its kernel.

Run: python examples/cann/1_basic_features/memory/7_physical_memory_sharing_withpid.py
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
PROP = {
    "handle_type": acl.ACL_MEM_HANDLE_TYPE_NONE,
    "allocation_type": acl.ACL_MEM_ALLOCATION_TYPE_PINNED,
    "mem_attr": acl.ACL_HBM_MEM_HUGE,
    "location": {"id": DEVICE, "type": acl.ACL_MEM_LOCATION_TYPE_DEVICE},
    "reserve": 0,
}
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


def map_physical(handle, size, who):
    """Reserve `size` bytes of device addresses, map physical memory `handle` there and give
    this device read-write access: the address."""
    vir_ptr, ret = acl.rt.reserve_mem_address(size, 0, 0, 0)
    check(ret, "acl.rt.reserve_mem_address")
    check(acl.rt.map_mem(vir_ptr, size, 0, handle, 0), "acl.rt.map_mem")
    access = {
        "flags": acl.ACL_RT_MEM_ACCESS_FLAGS_READWRITE,
        "location": {"id": DEVICE, "type": acl.ACL_MEM_LOCATION_TYPE_DEVICE},
    }
    check(acl.rt.mem_set_access(vir_ptr, size, [access], 1), "acl.rt.mem_set_access")
    print(f"[INFO] {who}: mapped the physical memory at {vir_ptr:#x}", flush=True)
    return vir_ptr


def granularity():
    size, ret = acl.rt.mem_get_allocation_granularity(
        PROP, acl.ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM
    )
    check(ret, "acl.rt.mem_get_allocation_granularity")
    return size


def process_a(folder):
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    size = granularity()
    handle, ret = acl.rt.malloc_physical(size, PROP, 0)
    check(ret, "acl.rt.malloc_physical")
    print(f"[INFO] A: allocated {size} bytes of physical memory", flush=True)
    vir_ptr = map_physical(handle, size, "A")
    launch("device_write", stream, "<Qi", vir_ptr, VALUE)
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    print(f"[INFO] A: wrote {VALUE} at {vir_ptr:#x}", flush=True)
    shareable, ret = acl.rt.mem_export_to_shareable_handle(
        handle, acl.ACL_MEM_HANDLE_TYPE_NONE, acl.ACL_RT_VMM_EXPORT_FLAG_DEFAULT
    )
    check(ret, "acl.rt.mem_export_to_shareable_handle")
    print(f"[INFO] A: exported the physical memory as {shareable:#x}", flush=True)
    (pid,) = struct.unpack("<i", receive(folder, "pid"))
    print(f"[INFO] A: process B's pid is {pid}", flush=True)
    check(
        acl.rt.mem_set_pid_to_shareable_handle(shareable, [pid]),
        "acl.rt.mem_set_pid_to_shareable_handle",
    )
    print("[INFO] A: process B may import the memory", flush=True)
    send(folder, "shareable", struct.pack("<Q", shareable))
    (done,) = struct.unpack("<i", receive(folder, "done"))
    print(f"[INFO] A: process B says it is done ({done})", flush=True)
    check(acl.rt.unmap_mem(vir_ptr), "acl.rt.unmap_mem")
    check(acl.rt.release_mem_address(vir_ptr), "acl.rt.release_mem_address")
    check(acl.rt.free_physical(handle), "acl.rt.free_physical")
    acl.rt.destroy_stream_force(stream)
    acl.rt.reset_device_force(DEVICE)
    acl.finalize()


def process_b(folder):
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    pid, ret = acl.rt.device_get_bare_tgid()
    check(ret, "acl.rt.device_get_bare_tgid")
    send(folder, "pid", struct.pack("<i", pid))
    print(f"[INFO] B: gave process A my pid {pid}", flush=True)
    (shareable,) = struct.unpack("<Q", receive(folder, "shareable"))
    print(f"[INFO] B: got the shareable handle {shareable:#x}", flush=True)
    handle, ret = acl.rt.mem_import_from_shareable_handle(shareable, DEVICE)
    check(ret, "acl.rt.mem_import_from_shareable_handle")
    size = granularity()
    vir_ptr = map_physical(handle, size, "B")
    launch("device_read", stream, "<Q", vir_ptr)
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    host, ret = acl.rt.malloc_host(size)
    check(ret, "acl.rt.malloc_host")
    check(acl.rt.memcpy(host, size, vir_ptr, size, acl.ACL_MEMCPY_DEVICE_TO_HOST), "acl.rt.memcpy")
    (copied,) = struct.unpack("<i", acl.util.ptr_to_bytes(host, 4))
    print(f"[INFO] B: copied {copied} to the host", flush=True)
    send(folder, "done", struct.pack("<i", 1))
    print("[INFO] B: done with the shared memory", flush=True)
    check(acl.rt.unmap_mem(vir_ptr), "acl.rt.unmap_mem")
    check(acl.rt.release_mem_address(vir_ptr), "acl.rt.release_mem_address")
    check(acl.rt.free_physical(handle), "acl.rt.free_physical")
    acl.rt.free_host(host)
    acl.rt.destroy_stream_force(stream)
    acl.rt.reset_device_force(DEVICE)
    acl.finalize()


def printed(log, label):
    """The value after the first `label:` line of `log`, or None."""
    found = re.search(rf"^{label}: *(\S+)", log, re.MULTILINE)
    return found.group(1) if found else None


def main():
    with tempfile.TemporaryDirectory(prefix="physical-memory-") as folder:
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
