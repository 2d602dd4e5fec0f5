"""Follows the CANN runtime's example/2_advanced_features/built_in_task/0_reduce_task: a
reduce task on a stream (acl.rt.reduce_async, ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM) adds a
float32 buffer into another one, element by element, on the device."""

import struct
import sys

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_FLOAT = 0
ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM = 10
COUNT = 4


def check(ret, what):
    if ret != ACL_SUCCESS:
        print(f"{what} failed with error code {ret}")
        sys.exit(1)


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")

    values = [1.0, 2.0, 3.0, 4.0]
    host_input = struct.pack(f"<{COUNT}f", *values)
    size = len(host_input)
    dev_input, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    dev_output, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")

    # Both buffers start with the same values: the sum doubles them.
    source = acl.util.bytes_to_ptr(host_input)
    check(acl.rt.memcpy(dev_input, size, source, size, ACL_MEMCPY_HOST_TO_DEVICE), "acl.rt.memcpy")
    check(acl.rt.memcpy(dev_output, size, source, size, ACL_MEMCPY_HOST_TO_DEVICE), "acl.rt.memcpy")

    ret = acl.rt.reduce_async(
        dev_output, dev_input, size, ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM, ACL_FLOAT, stream, 0
    )
    check(ret, "acl.rt.reduce_async")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")

    host_output = bytes(size)
    target = acl.util.bytes_to_ptr(host_output)
    check(acl.rt.memcpy(target, size, dev_output, size, ACL_MEMCPY_DEVICE_TO_HOST), "acl.rt.memcpy")
    results = struct.unpack(f"<{COUNT}f", host_output)
    for index, value in enumerate(results):
        print(f"Reduce SUM result[{index}] = {value:f}")

    acl.rt.free(dev_input)
    acl.rt.free(dev_output)
    acl.rt.destroy_stream(stream)
    acl.rt.reset_device_force(0)
    acl.finalize()

    expected = [2 * value for value in values]
    if list(results) != expected:
        print(f"Reduce SUM gave {list(results)}, expected {expected}")
        return 1
    print("Sample Run Successfully.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
