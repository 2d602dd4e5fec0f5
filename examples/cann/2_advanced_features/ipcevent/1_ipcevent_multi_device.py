"""One producer on device 0 synchronizes consumers on other devices through an IPC event
(pyACL).

Follows the CANN runtime's example `2_advanced_features/ipcevent/1_ipcevent_multi_device`.
First a check of the device count: with fewer devices than one producer and its consumers
need, the program says it skips and ends with status 0, as the example does. Otherwise the
producer creates an ACL_EVENT_IPC event on device 0, records and synchronizes it, checks
its status and writes its IPC handle to a file; each consumer, on a device of its own
(1, 2, ...), opens the event, has a stream wait for it, works, records it, synchronizes
it, checks its status and leaves a done flag; the producer waits for every flag.

Run: python examples/cann/2_advanced_features/ipcevent/1_ipcevent_multi_device.py
(with a daemon of at least two devices: `simnpu serve --devices 2`).
"""

import os
import subprocess
import sys
import tempfile
import time

import acl

CONSUMERS = 1
MAX_CONSUMERS = 8
WAIT_S = 120  # how long a process waits for another's file


def check(ret, what):
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {what} failed: ret={ret} ({acl.get_recent_err_msg()})", flush=True)
        sys.exit(1)


def devices_suffice(needed):
    """The precheck: 0 when there are `needed` devices, 2 (skip) when fewer, 1 on error."""
    check(acl.init(), "acl.init")
    count, ret = acl.rt.get_device_count()
    acl.finalize()
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] acl.rt.get_device_count failed: ret={ret}", flush=True)
        return 1
    print(f"[INFO] {count} device(s) available, {needed} needed", flush=True)
    if count < needed:
        print(f"[SKIP] this needs at least {needed} devices; only {count} available", flush=True)
        return 2
    return 0


def producer(folder, consumers):
    handle_file = os.path.join(folder, "event_handle.bin")
    if not 0 < consumers <= MAX_CONSUMERS:
        print(f"[ERROR] the number of consumers must be 1 to {MAX_CONSUMERS}", flush=True)
        sys.exit(1)
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    event, ret = acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_IPC)
    check(ret, "acl.rt.create_event_ex_with_flag")
    print("[INFO] producer: made an IPC event on device 0", flush=True)
    check(acl.rt.record_event(event, stream), "acl.rt.record_event")
    check(acl.rt.synchronize_event(event), "acl.rt.synchronize_event")
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
    print("[INFO] producer: wrote the IPC handle to a file", flush=True)
    print(f"[INFO] producer: waiting for {consumers} consumer(s)", flush=True)
    flags = [os.path.join(folder, f"consumer_{n}.done") for n in range(1, consumers + 1)]
    deadline = time.monotonic() + WAIT_S
    while not all(os.path.exists(flag) for flag in flags):
        if time.monotonic() > deadline:
            done = sum(os.path.exists(flag) for flag in flags)
            print(f"[ERROR] only {done} of {consumers} consumers finished in time", flush=True)
            sys.exit(1)
        time.sleep(0.05)
    print(f"[INFO] producer: all {consumers} consumer(s) are done", flush=True)
    check(acl.rt.destroy_event(event), "acl.rt.destroy_event")
    acl.rt.destroy_stream(stream)
    acl.rt.reset_device(0)
    acl.finalize()
    for path in (handle_file, *flags):
        os.remove(path)
    print("[INFO] producer: finished successfully", flush=True)


def consumer(folder, device, number):
    handle_file = os.path.join(folder, "event_handle.bin")
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(device), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    print(f"[INFO] consumer {number} (device {device}): waiting for the handle", flush=True)
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(handle_file):
        if time.monotonic() > deadline:
            print(f"[ERROR] consumer {number}: gave up waiting for the handle", flush=True)
            sys.exit(1)
        time.sleep(0.05)
    with open(handle_file, "rb") as source:
        handle = source.read()
    event, ret = acl.rt.ipc_open_event_handle(handle)
    check(ret, "acl.rt.ipc_open_event_handle")
    print(f"[INFO] consumer {number}: opened the IPC event on device {device}", flush=True)
    check(acl.rt.stream_wait_event(stream, event), "acl.rt.stream_wait_event")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    print(f"[INFO] consumer {number}: the event has come; stream synchronized", flush=True)
    time.sleep(0.2)  # its own work
    check(acl.rt.record_event(event, stream), "acl.rt.record_event")
    check(acl.rt.synchronize_event(event), "acl.rt.synchronize_event")
    status, ret = acl.rt.query_event_status(event)
    check(ret, "acl.rt.query_event_status")
    print(f"[INFO] consumer {number}: event status {status} (1 = complete)", flush=True)
    if status != acl.ACL_EVENT_RECORDED_STATUS_COMPLETE:
        print(f"[ERROR] consumer {number}: the event is not complete", flush=True)
        sys.exit(1)
    with open(os.path.join(folder, f"consumer_{number}.done"), "w") as flag:
        flag.write("done")
    check(acl.rt.destroy_event(event), "acl.rt.destroy_event")
    acl.rt.destroy_stream(stream)
    acl.rt.reset_device(device)
    acl.finalize()
    print(f"[INFO] consumer {number} (device {device}) finished successfully", flush=True)


def main():
    verdict = devices_suffice(CONSUMERS + 1)
    if verdict == 2:
        return 0
    if verdict != 0:
        print("[ERROR] the device count check failed")
        return verdict
    print(f"[INFO] producer on device 0, {CONSUMERS} consumer(s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="ipcevent-") as folder:
        commands = [["producer", folder, str(CONSUMERS)]] + [
            ["consumer", folder, str(n), str(n)] for n in range(1, CONSUMERS + 1)
        ]
        roles = [
            subprocess.Popen(
                [sys.executable, __file__, *command],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for command in commands
        ]
        try:
            logs = [role.communicate(timeout=4 * WAIT_S)[0] for role in roles]
        finally:
            for role in roles:
                if role.poll() is None:
                    role.kill()
                    role.wait()
    for log in logs[1:] + logs[:1]:
        print(log, end="")
    if all(role.returncode == 0 for role in roles) and "finished successfully" in logs[0]:
        print("[SUCCESS] the IPC event synchronized processes on several devices")
        return 0
    print("[FAILURE] synchronizing devices through the IPC event failed")
    return 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "producer":
        producer(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "consumer":
        consumer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(main())
