"""After the CANN runtime's example/2_advanced_features/model_ri/4_model_sync_external: a
captured model synchronized with work outside it through an event, three ways.

1. An ordinary stream records the event; the model waits for it (a wait captured with
   ACL_EVENT_WAIT_EXTERNAL binds, at each replay, to the event's latest record).
2. The model records the event (ACL_EVENT_RECORD_EXTERNAL); an ordinary stream waits for it
   after the replay is queued, then copies the model's output to the host.
3. One model records the event, a second model waits for it.

Each scenario copies eight int32 values 1..8 from one device buffer to another inside a
model and checks the host gets them back.
"""

import ctypes
import struct
import sys

import acl

DEVICE_ID = 0
VALUES = [1, 2, 3, 4, 5, 6, 7, 8]
SIZE = len(VALUES) * 4
D2D = acl.ACL_MEMCPY_DEVICE_TO_DEVICE
RELAXED = acl.ACL_MODEL_RI_CAPTURE_MODE_RELAXED


def check(ret, call):
    """Stop the program (status 1) when an acl call did not succeed."""
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {call} failed with ret = {ret} ({acl.get_recent_err_msg()})")
        sys.exit(1)


def made(pair, call):
    """The value of a (value, ret) pair, the program stopped if ret is not success."""
    value, ret = pair
    check(ret, call)
    return value


def device_buffers(count):
    return [
        made(acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST), "acl.rt.malloc")
        for _ in range(count)
    ]


def upload(device):
    data = struct.pack(f"<{len(VALUES)}i", *VALUES)
    check(
        acl.rt.memcpy(
            device, SIZE, acl.util.bytes_to_ptr(data), SIZE, acl.ACL_MEMCPY_HOST_TO_DEVICE
        ),
        "acl.rt.memcpy",
    )


def matches(host):
    """Compare the host buffer with 1..8; print the verdict."""
    got = list(host)
    for index, (value, want) in enumerate(zip(got, VALUES)):
        if value != want:
            print(f"  [ERROR] index {index}: got {value}, expected {want}")
            return False
    print("  result matches 1..8")
    return True


def download(device):
    host = (ctypes.c_int32 * len(VALUES))()
    check(
        acl.rt.memcpy(ctypes.addressof(host), SIZE, device, SIZE, acl.ACL_MEMCPY_DEVICE_TO_HOST),
        "acl.rt.memcpy",
    )
    return host


def release(models, event, buffers, streams):
    for model in models:
        check(acl.mdl.ri_destroy(model), "acl.mdl.ri_destroy")
    check(acl.rt.destroy_event(event), "acl.rt.destroy_event")
    for buffer in buffers:
        check(acl.rt.free(buffer), "acl.rt.free")
    for stream in streams:
        check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")


def new_event():
    return made(acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_SYNC), "create_event_ex_with_flag")


def scenario_stream_records_model_waits():
    print("scenario 1: a stream records the event, the model waits for it")
    graph_stream = made(acl.rt.create_stream(), "acl.rt.create_stream")
    other_stream = made(acl.rt.create_stream(), "acl.rt.create_stream")
    event = new_event()
    src, dst = device_buffers(2)
    check(acl.mdl.ri_capture_begin(graph_stream, RELAXED), "acl.mdl.ri_capture_begin")
    check(
        acl.rt.stream_wait_event_with_flag(graph_stream, event, 0, acl.ACL_EVENT_WAIT_EXTERNAL),
        "acl.rt.stream_wait_event_with_flag",
    )
    check(acl.rt.memcpy_async(dst, SIZE, src, SIZE, D2D, graph_stream), "acl.rt.memcpy_async")
    model = made(acl.mdl.ri_capture_end(graph_stream), "acl.mdl.ri_capture_end")
    upload(src)
    check(acl.rt.record_event(event, other_stream), "acl.rt.record_event")
    check(acl.mdl.ri_execute_async(model, graph_stream), "acl.mdl.ri_execute_async")
    check(acl.rt.synchronize_stream(graph_stream), "acl.rt.synchronize_stream")
    ok = matches(download(dst))
    release([model], event, [src, dst], [graph_stream, other_stream])
    return ok


def scenario_model_records_stream_waits():
    print("scenario 2: the model records the event, a stream waits for it")
    graph_stream = made(acl.rt.create_stream(), "acl.rt.create_stream")
    other_stream = made(acl.rt.create_stream(), "acl.rt.create_stream")
    event = new_event()
    src, dst = device_buffers(2)
    upload(src)
    check(acl.mdl.ri_capture_begin(graph_stream, RELAXED), "acl.mdl.ri_capture_begin")
    check(acl.rt.memcpy_async(dst, SIZE, src, SIZE, D2D, graph_stream), "acl.rt.memcpy_async")
    check(
        acl.rt.record_event_with_flag(event, graph_stream, acl.ACL_EVENT_RECORD_EXTERNAL),
        "acl.rt.record_event_with_flag",
    )
    model = made(acl.mdl.ri_capture_end(graph_stream), "acl.mdl.ri_capture_end")
    check(acl.mdl.ri_execute_async(model, graph_stream), "acl.mdl.ri_execute_async")
    check(acl.rt.stream_wait_event(other_stream, event), "acl.rt.stream_wait_event")
    pinned = made(acl.rt.malloc_host(SIZE), "acl.rt.malloc_host")
    check(
        acl.rt.memcpy_async(pinned, SIZE, dst, SIZE, acl.ACL_MEMCPY_DEVICE_TO_HOST, other_stream),
        "acl.rt.memcpy_async",
    )
    check(acl.rt.synchronize_stream(other_stream), "acl.rt.synchronize_stream")
    ok = matches((ctypes.c_int32 * len(VALUES)).from_address(pinned))
    check(acl.rt.free_host(pinned), "acl.rt.free_host")
    release([model], event, [src, dst], [graph_stream, other_stream])
    return ok


def scenario_model_records_model_waits():
    print("scenario 3: one model records the event, another model waits for it")
    first_stream = made(acl.rt.create_stream(), "acl.rt.create_stream")
    second_stream = made(acl.rt.create_stream(), "acl.rt.create_stream")
    event = new_event()
    src, middle, dst = device_buffers(3)
    upload(src)
    check(acl.mdl.ri_capture_begin(first_stream, RELAXED), "acl.mdl.ri_capture_begin")
    check(acl.rt.memcpy_async(middle, SIZE, src, SIZE, D2D, first_stream), "acl.rt.memcpy_async")
    check(
        acl.rt.record_event_with_flag(event, first_stream, acl.ACL_EVENT_RECORD_EXTERNAL),
        "acl.rt.record_event_with_flag",
    )
    first = made(acl.mdl.ri_capture_end(first_stream), "acl.mdl.ri_capture_end")
    check(acl.mdl.ri_capture_begin(second_stream, RELAXED), "acl.mdl.ri_capture_begin")
    check(
        acl.rt.stream_wait_event_with_flag(second_stream, event, 0, acl.ACL_EVENT_WAIT_EXTERNAL),
        "acl.rt.stream_wait_event_with_flag",
    )
    check(acl.rt.memcpy_async(dst, SIZE, middle, SIZE, D2D, second_stream), "acl.rt.memcpy_async")
    second = made(acl.mdl.ri_capture_end(second_stream), "acl.mdl.ri_capture_end")
    check(acl.mdl.ri_execute_async(first, first_stream), "acl.mdl.ri_execute_async")
    check(acl.mdl.ri_execute_async(second, second_stream), "acl.mdl.ri_execute_async")
    check(acl.rt.synchronize_stream(second_stream), "acl.rt.synchronize_stream")
    ok = matches(download(dst))
    release([first, second], event, [src, middle, dst], [first_stream, second_stream])
    return ok


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    context = made(acl.rt.create_context(DEVICE_ID), "acl.rt.create_context")
    results = [
        scenario_stream_records_model_waits(),
        scenario_model_records_stream_waits(),
        scenario_model_records_model_waits(),
    ]
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    if not all(results):
        print(f"[ERROR] {results.count(False)} scenario(s) gave a wrong result")
        sys.exit(1)
    print("model_sync_external: all 3 scenarios passed")


if __name__ == "__main__":
    main()
