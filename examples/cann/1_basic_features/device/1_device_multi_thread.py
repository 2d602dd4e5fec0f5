"""Follows the CANN runtime's example/1_basic_features/device/1_device_multi_thread.

A device used from two threads. The main thread initializes, sets device 0 and limits
this process to one vector core on it (aclrtSetDeviceResLimit); a second thread sets
the device for itself, creates a stream, asks the runtime about the device (SoC name,
device count, status, run mode, utilization, stream priorities, vector cores), reads the
resource limit back, and launches a vector addition on as many blocks as the limit
allows. It prints the first ten sums beside the expected ones, resets the limit and
releases everything (aclrtResetDeviceForce); the main thread then finalizes.

The vendor's Ascend C kernel (`AddKernel`: each block adds its share in 8 tiles, double
buffered) is the Python kernel `add_kernel` below.

Run: python examples/cann/1_basic_features/device/1_device_multi_thread.py
"""

import ctypes
import struct
import sys
import threading

import numpy as np

import acl

DEVICE_ID = 0
TOTAL_SIZE = 1024
DATA_SIZE = TOTAL_SIZE * 4
SHOWN = 10

KERNEL_SOURCE = """
import numpy as np

from simnpu import kernel

TILES = 8 * 2  # 8 tiles a block, each in two halves (the vendor kernel's double buffer)


@kernel("ptr", "ptr", "ptr", "u32")
def add_kernel(ctx, src_a, src_b, dst, total_size):
    per_block = total_size // ctx.block_num
    tile = per_block // TILES
    start = ctx.block_idx * per_block
    for progress in range(TILES):
        offset = 4 * (start + progress * tile)
        a = ctx.gm(src_a + offset, "float32", tile, access="r")
        b = ctx.gm(src_b + offset, "float32", tile, access="r")
        np.add(a, b, out=ctx.gm(dst + offset, "float32", tile))
"""


class Failed(Exception):
    """A call returned an error code; the message names it."""


def check(ret: int, call: str) -> None:
    if ret != acl.ACL_SUCCESS:
        raise Failed(f"{call} returned error code {ret}: {acl.get_recent_err_msg()}")


def query_device() -> None:
    """What the worker thread asks the runtime about device 0."""
    print(f"[INFO]  SoC name: {acl.rt.get_soc_name()}.")
    count, ret = acl.rt.get_device_count()
    check(ret, "acl.rt.get_device_count")
    print(f"[INFO]  Device count: {count}.")
    status, ret = acl.rt.query_device_status(DEVICE_ID)
    check(ret, "acl.rt.query_device_status")
    print(f"[INFO]  Device status: {status}.")
    mode, ret = acl.rt.get_run_mode()
    check(ret, "acl.rt.get_run_mode")
    names = {acl.ACL_DEVICE: "ACL_DEVICE", acl.ACL_HOST: "ACL_HOST"}
    print(f"[INFO]  Run mode: {names.get(mode, 'invalid')}.")
    usage, ret = acl.rt.get_device_utilization_rate(DEVICE_ID)
    check(ret, "acl.rt.get_device_utilization_rate")
    print(
        "[INFO]  Utilization: cube {cube_utilization}, vector {vector_utilization}, "
        "aicpu {aicpu_utilization}, memory {memory_utilization}.".format(**usage)
    )
    least, greatest, ret = acl.rt.device_get_stream_priority_range()
    check(ret, "acl.rt.device_get_stream_priority_range")
    print(f"[INFO]  Stream priorities: least {least}, greatest {greatest}.")
    cores, ret = acl.rt.get_device_info(DEVICE_ID, acl.ACL_DEV_ATTR_VECTOR_CORE_NUM)
    check(ret, "acl.rt.get_device_info")
    print(f"[INFO]  Vector cores: {cores}.")


def host_floats(ptr: int) -> np.ndarray:
    """A float32 view of TOTAL_SIZE elements of host memory at `ptr`."""
    return np.frombuffer((ctypes.c_float * TOTAL_SIZE).from_address(ptr), np.float32)


def run_thread(outcome: list[str]) -> None:
    """The worker thread: everything after the main thread's limit. Appends "ok" or why not."""
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    query_device()

    hosts = []
    for _ in range(3):
        ptr, ret = acl.rt.malloc_host(DATA_SIZE)
        check(ret, "acl.rt.malloc_host")
        hosts.append(ptr)
    devs = []
    for _ in range(3):
        ptr, ret = acl.rt.malloc(DATA_SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        check(ret, "acl.rt.malloc")
        devs.append(ptr)
    src_a, src_b, dst = (host_floats(ptr) for ptr in hosts)
    src_a[:] = np.arange(TOTAL_SIZE)
    src_b[:] = np.arange(TOTAL_SIZE)
    for dev, host in zip(devs[:2], hosts[:2]):
        ret = acl.rt.memcpy(dev, DATA_SIZE, host, DATA_SIZE, acl.ACL_MEMCPY_HOST_TO_DEVICE)
        check(ret, "acl.rt.memcpy")

    limit, ret = acl.rt.get_device_res_limit(DEVICE_ID, acl.ACL_RT_DEV_RES_VECTOR_CORE)
    check(ret, "acl.rt.get_device_res_limit")
    print(f"[INFO]  Vector core limit of this process: {limit}.")
    binary, ret = acl.rt.binary_load_from_data(KERNEL_SOURCE)
    check(ret, "acl.rt.binary_load_from_data")
    func, ret = acl.rt.binary_get_function(binary, "add_kernel")
    check(ret, "acl.rt.binary_get_function")
    args = struct.pack("<QQQI", *devs, TOTAL_SIZE)
    ret = acl.rt.launch_kernel_with_host_args(
        func, limit, stream, None, acl.util.bytes_to_ptr(args), len(args)
    )
    check(ret, "acl.rt.launch_kernel_with_host_args")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    ret = acl.rt.memcpy(hosts[2], DATA_SIZE, devs[2], DATA_SIZE, acl.ACL_MEMCPY_DEVICE_TO_HOST)
    check(ret, "acl.rt.memcpy")

    print(f"[INFO]  The kernel's first {SHOWN} sums:")
    for i in range(SHOWN):
        print(f"[INFO]  hostDst[{i}] = {dst[i]:f}, expected {src_a[i] + src_b[i]:f}")
    wrong = np.flatnonzero(dst != src_a + src_b)
    if wrong.size:
        outcome.append(f"{wrong.size} sums are wrong, the first at index {wrong[0]}")

    check(acl.rt.reset_device_res_limit(DEVICE_ID), "acl.rt.reset_device_res_limit")
    del src_a, src_b, dst
    for ptr in devs:
        check(acl.rt.free(ptr), "acl.rt.free")
    for ptr in hosts:
        check(acl.rt.free_host(ptr), "acl.rt.free_host")
    check(acl.rt.binary_unload(binary), "acl.rt.binary_unload")
    check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    if not outcome:
        outcome.append("ok")


def thread_body(outcome: list[str]) -> None:
    try:
        run_thread(outcome)
    except Failed as failure:
        outcome.append(str(failure))


def main() -> int:
    print("[INFO]  device_multi_thread: starting.")
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    ret = acl.rt.set_device_res_limit(DEVICE_ID, acl.ACL_RT_DEV_RES_VECTOR_CORE, 1)
    check(ret, "acl.rt.set_device_res_limit")

    outcome: list[str] = []
    worker = threading.Thread(target=thread_body, args=(outcome,))
    worker.start()
    worker.join()

    check(acl.finalize(), "acl.finalize")
    if outcome != ["ok"]:
        print(f"[ERROR]  the worker thread failed: {'; '.join(outcome)}")
        return 1
    print("[INFO]  device_multi_thread: the thread's sums are right; done.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as failure:
        print(f"[ERROR]  {failure}")
        sys.exit(1)
