"""A pyACL program in the style of the asynchronous-inference samples, written for
simnpu's tests against the pyACL documentation: a callback thread started with
acl.util.start_thread loops on process_report; results are handed to it with
launch_callback after each batch's copies; exit flag, unsubscribe, stop_thread."""

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_CALLBACK_BLOCK = 1
BATCHES = 5
SIZE = 65536


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception("{} failed ret={}".format(message, ret))


class Pipeline(object):
    def __init__(self, device_id):
        self.device_id = device_id
        self.exit_flag = False
        self.results = []
        ret = acl.init()
        check_ret("acl.init", ret)
        ret = acl.rt.set_device(device_id)
        check_ret("acl.rt.set_device", ret)
        self.context, ret = acl.rt.create_context(device_id)
        check_ret("acl.rt.create_context", ret)
        self.stream, ret = acl.rt.create_stream()
        check_ret("acl.rt.create_stream", ret)

    def _process_callback(self, args_list):
        context, timeout = args_list
        acl.rt.set_context(context)
        while self.exit_flag is False:
            acl.rt.process_report(timeout)

    def _callback_func(self, user_data):
        batch, host_ptr, expected = user_data
        self.results.append((batch, acl.util.ptr_to_bytes(host_ptr, SIZE) == expected))

    def run(self):
        tid, ret = acl.util.start_thread(self._process_callback, [self.context, 50])
        check_ret("acl.util.start_thread", ret)
        ret = acl.rt.subscribe_report(tid, self.stream)
        check_ret("acl.rt.subscribe_report", ret)
        dev, ret = acl.rt.malloc(SIZE, 0)
        check_ret("acl.rt.malloc", ret)
        keep = []
        for batch in range(BATCHES):
            data = np.full(SIZE, batch, dtype=np.uint8).tobytes()
            host_out, ret = acl.rt.malloc_host(SIZE)
            check_ret("acl.rt.malloc_host", ret)
            keep.append((data, host_out))
            ret = acl.rt.memcpy_async(
                dev, SIZE, acl.util.bytes_to_ptr(data), SIZE, ACL_MEMCPY_HOST_TO_DEVICE, self.stream
            )
            check_ret("acl.rt.memcpy_async", ret)
            ret = acl.rt.memcpy_async(
                host_out, SIZE, dev, SIZE, ACL_MEMCPY_DEVICE_TO_HOST, self.stream
            )
            check_ret("acl.rt.memcpy_async", ret)
            ret = acl.rt.launch_callback(
                self._callback_func, [batch, host_out, data], ACL_CALLBACK_BLOCK, self.stream
            )
            check_ret("acl.rt.launch_callback", ret)
        ret = acl.rt.synchronize_stream(self.stream)
        check_ret("acl.rt.synchronize_stream", ret)
        ret = acl.rt.unsubscribe_report(tid, self.stream)
        check_ret("acl.rt.unsubscribe_report", ret)
        self.exit_flag = True
        ret = acl.util.stop_thread(tid)
        check_ret("acl.util.stop_thread", ret)
        print("[INFO] callback results: {}".format(self.results))
        if self.results != [(batch, True) for batch in range(BATCHES)]:
            raise Exception("callbacks saw wrong data or ran out of order")
        for _, host_out in keep:
            ret = acl.rt.free_host(host_out)
            check_ret("acl.rt.free_host", ret)
        ret = acl.rt.free(dev)
        check_ret("acl.rt.free", ret)

    def release(self):
        ret = acl.rt.destroy_stream(self.stream)
        check_ret("acl.rt.destroy_stream", ret)
        ret = acl.rt.destroy_context(self.context)
        check_ret("acl.rt.destroy_context", ret)
        ret = acl.rt.reset_device(self.device_id)
        check_ret("acl.rt.reset_device", ret)
        ret = acl.finalize()
        check_ret("acl.finalize", ret)


if __name__ == "__main__":
    pipeline = Pipeline(0)
    pipeline.run()
    pipeline.release()
    print("run success")
