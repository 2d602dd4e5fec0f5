"""A pyACL program in the style of the Ascend memory samples, written for simnpu's tests
against the pyACL documentation (bare numbers for constants, as the samples use):
host -> pinned -> device -> device -> pinned, checked byte for byte."""

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_HBM_MEM = 1
SIZE = 4 * 1024 * 1024


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception("{} failed ret={}".format(message, ret))


def main():
    ret = acl.init()
    check_ret("acl.init", ret)
    ret = acl.rt.set_device(0)
    check_ret("acl.rt.set_device", ret)
    context, ret = acl.rt.create_context(0)
    check_ret("acl.rt.create_context", ret)
    stream, ret = acl.rt.create_stream()
    check_ret("acl.rt.create_stream", ret)
    free_before, total, ret = acl.rt.get_mem_info(ACL_HBM_MEM)
    check_ret("acl.rt.get_mem_info", ret)
    print("[INFO] device memory: free {} of {} bytes".format(free_before, total))

    data = np.random.randint(0, 255, size=SIZE, dtype=np.uint8)
    data_bytes = data.tobytes()
    host_in, ret = acl.rt.malloc_host(SIZE)
    check_ret("acl.rt.malloc_host", ret)
    host_out, ret = acl.rt.malloc_host(SIZE)
    check_ret("acl.rt.malloc_host", ret)
    dev_a, ret = acl.rt.malloc(SIZE, ACL_MEM_MALLOC_HUGE_FIRST)
    check_ret("acl.rt.malloc", ret)
    dev_b, ret = acl.rt.malloc(SIZE, ACL_MEM_MALLOC_HUGE_FIRST)
    check_ret("acl.rt.malloc", ret)

    ret = acl.rt.memcpy(
        host_in, SIZE, acl.util.bytes_to_ptr(data_bytes), SIZE, ACL_MEMCPY_HOST_TO_HOST
    )
    check_ret("acl.rt.memcpy", ret)
    ret = acl.rt.memcpy_async(dev_a, SIZE, host_in, SIZE, ACL_MEMCPY_HOST_TO_DEVICE, stream)
    check_ret("acl.rt.memcpy_async", ret)
    ret = acl.rt.memcpy_async(dev_b, SIZE, dev_a, SIZE, ACL_MEMCPY_DEVICE_TO_DEVICE, stream)
    check_ret("acl.rt.memcpy_async", ret)
    ret = acl.rt.memset_async(dev_a, SIZE, 0, SIZE, stream)
    check_ret("acl.rt.memset_async", ret)
    ret = acl.rt.memcpy_async(host_out, SIZE, dev_b, SIZE, ACL_MEMCPY_DEVICE_TO_HOST, stream)
    check_ret("acl.rt.memcpy_async", ret)
    ret = acl.rt.synchronize_stream(stream)
    check_ret("acl.rt.synchronize_stream", ret)

    result = acl.util.ptr_to_bytes(host_out, SIZE)
    print("[INFO] first bytes in: {} out: {}".format(list(data_bytes[:8]), list(result[:8])))
    if result != data_bytes:
        raise Exception("data mismatch")
    zeros = bytes(SIZE)
    ret = acl.rt.memcpy(acl.util.bytes_to_ptr(zeros), SIZE, dev_a, SIZE, ACL_MEMCPY_DEVICE_TO_HOST)
    check_ret("acl.rt.memcpy", ret)
    if zeros.count(0) != SIZE:
        raise Exception("memset_async did not clear the buffer")

    for ptr in (dev_a, dev_b):
        ret = acl.rt.free(ptr)
        check_ret("acl.rt.free", ret)
    for ptr in (host_in, host_out):
        ret = acl.rt.free_host(ptr)
        check_ret("acl.rt.free_host", ret)
    ret = acl.rt.destroy_stream(stream)
    check_ret("acl.rt.destroy_stream", ret)
    ret = acl.rt.destroy_context(context)
    check_ret("acl.rt.destroy_context", ret)
    ret = acl.rt.reset_device(0)
    check_ret("acl.rt.reset_device", ret)
    ret = acl.finalize()
    check_ret("acl.finalize", ret)
    print("run success")


if __name__ == "__main__":
    main()
