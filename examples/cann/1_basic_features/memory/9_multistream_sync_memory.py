"""After the CANN runtime's example/1_basic_features/memory/9_multistream_sync_memory.

Memory-semantic synchronization of two streams driven by two threads: the waiting thread
queues acl.rt.value_wait (ACL_STREAM_WAIT_VALUE_EQ 100) on stream A and synchronizes it;
a second later the writing thread writes a flag (123) to a file, then queues
acl.rt.value_write of 100 to the same device word on stream B and synchronizes it. Stream A
can only finish after stream B's write, so the waiting thread, reading the file after its
synchronize, finds the flag the writing thread wrote.
"""

import pathlib
import struct
import sys
import tempfile
import threading
import time

import acl

SIZE = 1 << 20
VALUE_COMPARE = 100
VALUE_WRITE = 100
FLAG = 123
WAIT_BEFORE_WRITER_S = 1.0


def info(text):
    """One whole line at once: the two threads print concurrently."""
    sys.stdout.write(f"[INFO]  {text}\n")


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        sys.stdout.write(f"[ERROR] {what} returned {ret}: {acl.get_recent_err_msg()}\n")
        sys.exit(1)


def write_flag(path, flag):
    """The flag as a native int32 in a file of its own."""
    info(f"Start writing to {path}")
    path.write_bytes(struct.pack("=i", flag))


def read_flag(path):
    """The int32 flag the file holds, 0 when it holds none."""
    info(f"Start reading from {path}")
    data = path.read_bytes() if path.exists() else b""
    if len(data) != 4:
        sys.stdout.write(f"[ERROR] {path} holds {len(data)} bytes, expected 4\n")
        return 0
    info("Read the flag successfully")
    return struct.unpack("=i", data)[0]


def wait_thread(stream, device_id, dev_ptr, value, path, flags):
    """Stream A: wait for the word to equal `value`, then read the writer's flag."""
    check(acl.rt.set_device(device_id), "acl.rt.set_device")
    check(acl.rt.value_wait(dev_ptr, value, acl.ACL_STREAM_WAIT_VALUE_EQ, stream), "value_wait")
    info(f"Stream A: waiting until the word at {dev_ptr:#x} equals {value}")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    info("Stream A: the word met the condition, the stream is done")
    flags["read"] = read_flag(path)
    info(f"Flag read by the waiting thread: {flags['read']}")


def write_thread(stream, device_id, dev_ptr, value, path, flags):
    """Stream B: write the flag to the file, then `value` to the word."""
    write_flag(path, FLAG)
    info(f"Flag written by the writing thread: {FLAG}")
    check(acl.rt.set_device(device_id), "acl.rt.set_device")
    check(acl.rt.value_write(dev_ptr, value, 0, stream), "acl.rt.value_write")
    info(f"Stream B: writing {value} at {dev_ptr:#x}")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    info("Stream B: the word is written, the stream is done")
    flags["stream_b_done"] = True


def run(target, *args):
    """`target(*args)` on a thread of its own, started; a failed check ends only it, and a
    thread left waiting does not keep the process alive."""

    def body():
        try:
            target(*args)
        except SystemExit:
            pass

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def main():
    check(acl.init(), "acl.init")
    device_id = 0
    check(acl.rt.set_device(device_id), "acl.rt.set_device")

    dev, ret = acl.rt.malloc(SIZE, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    # Not in the vendor's program: a fresh block's contents are undefined, and a word that
    # already held 100 would let stream A pass before stream B writes.
    check(acl.rt.memset(dev, SIZE, 0, SIZE), "acl.rt.memset")
    info("device memory allocated")
    stream_a, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    info("stream A created")
    stream_b, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    info("stream B created")

    flags = {}
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "flag.txt"
        waiter = run(wait_thread, stream_a, device_id, dev, VALUE_COMPARE, path, flags)
        time.sleep(WAIT_BEFORE_WRITER_S)  # as the vendor does; the result does not depend on it
        writer = run(write_thread, stream_b, device_id, dev, VALUE_WRITE, path, flags)
        writer.join()
        if not flags.get("stream_b_done"):
            sys.stdout.write("[ERROR] the writing thread failed; stream A would wait forever\n")
            sys.exit(1)
        waiter.join()

    check(acl.rt.destroy_stream_force(stream_a), "acl.rt.destroy_stream_force")
    check(acl.rt.destroy_stream_force(stream_b), "acl.rt.destroy_stream_force")
    check(acl.rt.free(dev), "acl.rt.free")
    check(acl.rt.reset_device_force(device_id), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    if flags.get("read") != FLAG:
        sys.stdout.write(f"[ERROR] the waiting thread read {flags.get('read')}, expected {FLAG}\n")
        sys.exit(1)
    info("the waiting thread read the writer's flag: the streams synchronized through memory")


if __name__ == "__main__":
    main()
