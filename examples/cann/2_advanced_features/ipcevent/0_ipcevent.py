"""Two processes synchronized by an IPC event (pyACL).

Follows the CANN runtime's example `2_advanced_features/ipcevent/0_ipcevent`. A producer
creates an event with ACL_EVENT_IPC, records it, synchronizes it, checks that its status
is complete and writes the event's 64-byte IPC handle to a file. A consumer reads the
handle, opens the event, has a stream wait for it, does its own work, records the event
itself, synchronizes it and checks its status, then leaves a flag file that tells the
producer it is done. Both destroy the event on their side.

Run: python examples/cann/2_advanced_features/ipcevent/0_ipcevent.py
The program starts both roles as processes of its own and prints their logs.
"""

import os
import subprocess
import sys
import tempfile
import time

import acl

WAIT_S = 120  # how long a process waits for the other's file


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {what} failed: ret={ret} ({acl.get_recent_err_msg()})", flush=True)
        sys.exit(1)


def wait_for(path):
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            print(f"[ERROR] gave up waiting for {os.path.basename(path)}", flush=True)
            sys.exit(1)
        time.sleep(0.05)


def producer(folder):
    handle_file = os.path.join(folder, "event_handle.bin")
    done_file = os.path.join(folder, "consumer_done.flag")
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    event, ret = acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC)
    check(ret, "acl.rt.create_event_ex_with_flag")
    print("[INFO] producer: made an event that other processes may open", flush=True)
    check(acl.rt.record_event(event, stream), "acl.rt.record_event")
    check(acl.rt.synchronize_event(event), "acl.rt.synchronize_event")
    print("[INFO] producer: recorded the event and synchronized it", flush=True)
    status, ret = acl.rt.query_event_status(event)
    check(ret, "acl.rt.query_event_status")
    if status != acl.ACL_EVENT_RECORDED_STATUS_COMPLETE:
        print(f"[ERROR] producer: event status {status}, expected 1", flush=True)
        sys.exit(1)
    print(f"[INFO] producer: event status {status} (1 = complete)", flush=True)
    handle, ret = acl.rt.ipc_get_event_handle(event)
    check(ret, "acl.rt.ipc_get_event_handle")
    with open(handle_file + ".part", "wb") as out:
        out.write(handle)
    os.replace(handle_file + ".part", handle_file)
    print(f"[INFO] producer: wrote the {len(handle)}-byte IPC handle to a file", flush=True)
    print("[INFO] producer: waiting until the consumer is done", flush=True)
    wait_for(done_file)
    print("[INFO] producer: the consumer is done", flush=True)
    check(acl.rt.destroy_event(event), "acl.rt.destroy_event")
    acl.rt.destroy_stream(stream)
    acl.rt.reset_device(0)
    acl.finalize()
    os.remove(handle_file)
    os.remove(done_file)
    print("[INFO] producer: released everything", flush=True)


def consumer(folder):
    handle_file = os.path.join(folder, "event_handle.bin")
    done_file = os.path.join(folder, "consumer_done.flag")
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    print("[INFO] consumer: waiting for the handle file", flush=True)
    wait_for(handle_file)
    with open(handle_file, "rb") as source:
        handle = source.read()
    print("[INFO] consumer: read the handle", flush=True)
    event, ret = acl.rt.ipc_open_event_handle(handle)
    check(ret, "acl.rt.ipc_open_event_handle")
    print("[INFO] consumer: opened the producer's event", flush=True)
    check(acl.rt.stream_wait_event(stream, event), "acl.rt.stream_wait_event")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    print("[INFO] consumer: the event has come; the stream is synchronized", flush=True)
    print("[INFO] consumer: working for a moment", flush=True)
    time.sleep(0.5)
    check(acl.rt.record_event(event, stream), "acl.rt.record_event")
    check(acl.rt.synchronize_event(event), "acl.rt.synchronize_event")
    print("[INFO] consumer: recorded the event", flush=True)
    status, ret = acl.rt.query_event_status(event)
    check(ret, "acl.rt.query_event_status")
    print(f"[INFO] consumer: event status {status} (1 = complete)", flush=True)
    if status != acl.ACL_EVENT_RECORDED_STATUS_COMPLETE:
        print("[ERROR] consumer: the event is not complete", flush=True)
        sys.exit(1)
    with open(done_file, "w") as flag:
        flag.write("done")
    print("[INFO] consumer: left the done flag", flush=True)
    check(acl.rt.destroy_event(event), "acl.rt.destroy_event")
    acl.rt.destroy_stream(stream)
    acl.rt.reset_device(0)
    acl.finalize()
    print("[INFO] consumer: released everything", flush=True)


def main():
    with tempfile.TemporaryDirectory(prefix="ipcevent-") as folder:
        roles = [
            subprocess.Popen(
                [sys.executable, __file__, role, folder],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for role in ("producer", "consumer")
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
    if all(role.returncode == 0 for role in roles) and "released everything" in logs[0]:
        print("[SUCCESS] the two processes synchronized through the IPC event")
        return 0
    print("[FAILURE] synchronizing through the IPC event failed")
    return 1


if __name__ == "__main__":
    if len(sys.argv) == 3:
        {"producer": producer, "consumer": consumer}[sys.argv[1]](sys.argv[2])
    else:
        sys.exit(main())
