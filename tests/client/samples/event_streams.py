"""A pyACL program written for simnpu's tests against the pyACL documentation: a producer
stream fills a buffer and records an event, a consumer stream waits for it with
stream_wait_event and copies the result back; event status, synchronize_event and
event_elapsed_time are checked along the way."""

import acl

ACL_SUCCESS = 0
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_EVENT_RECORDED_STATUS_COMPLETE = 1
ACL_EVENT_TIME_LINE = 0x8
SIZE = 1 << 20


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception("{} failed ret={}".format(message, ret))


def main():
    check_ret("acl.init", acl.init())
    check_ret("acl.rt.set_device", acl.rt.set_device(0))
    producer, ret = acl.rt.create_stream()
    check_ret("acl.rt.create_stream", ret)
    consumer, ret = acl.rt.create_stream()
    check_ret("acl.rt.create_stream", ret)
    start, ret = acl.rt.create_event_with_flag(ACL_EVENT_TIME_LINE)
    check_ret("acl.rt.create_event_with_flag", ret)
    ready, ret = acl.rt.create_event_with_flag(ACL_EVENT_TIME_LINE)
    check_ret("acl.rt.create_event_with_flag", ret)
    src, ret = acl.rt.malloc(SIZE, 0)
    check_ret("acl.rt.malloc", ret)
    dst, ret = acl.rt.malloc(SIZE, 0)
    check_ret("acl.rt.malloc", ret)

    check_ret("acl.rt.record_event", acl.rt.record_event(start, producer))
    for value in range(1, 9):
        check_ret("acl.rt.memset_async", acl.rt.memset_async(src, SIZE, value, SIZE, producer))
    check_ret("acl.rt.record_event", acl.rt.record_event(ready, producer))
    check_ret("acl.rt.stream_wait_event", acl.rt.stream_wait_event(consumer, ready))
    check_ret(
        "acl.rt.memcpy_async",
        acl.rt.memcpy_async(dst, SIZE, src, SIZE, ACL_MEMCPY_DEVICE_TO_DEVICE, consumer),
    )
    check_ret("acl.rt.synchronize_event", acl.rt.synchronize_event(ready))
    status, ret = acl.rt.query_event_status(ready)
    check_ret("acl.rt.query_event_status", ret)
    if status != ACL_EVENT_RECORDED_STATUS_COMPLETE:
        raise Exception("event not complete after synchronize_event")
    ms, ret = acl.rt.event_elapsed_time(start, ready)
    check_ret("acl.rt.event_elapsed_time", ret)
    print("[INFO] producer work took {:.3f} ms".format(ms))
    check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(consumer))

    out = bytes(SIZE)
    check_ret(
        "acl.rt.memcpy",
        acl.rt.memcpy(acl.util.bytes_to_ptr(out), SIZE, dst, SIZE, ACL_MEMCPY_DEVICE_TO_HOST),
    )
    print("[INFO] consumer copy starts with {}".format(list(out[:4])))
    if out != bytes([8]) * SIZE:
        raise Exception("the consumer copied before the producer finished")

    for ptr in (src, dst):
        check_ret("acl.rt.free", acl.rt.free(ptr))
    for event in (start, ready):
        check_ret("acl.rt.destroy_event", acl.rt.destroy_event(event))
    for stream in (producer, consumer):
        check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(stream))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(0))
    check_ret("acl.finalize", acl.finalize())
    print("run success")


if __name__ == "__main__":
    main()
