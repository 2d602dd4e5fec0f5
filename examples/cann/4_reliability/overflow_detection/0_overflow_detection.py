"""Follows the CANN runtime's example/4_reliability/overflow_detection/0_overflow_detection:
the device's float overflow mode (acl.rt.get_device_sat_mode / set_device_sat_mode), a
stream's overflow detection switch (set_stream_overflow_switch / get_stream_overflow_switch)
and the overflow status a stream writes into a 64-byte device buffer
(get_overflow_status) before and after reset_overflow_status.

It switches the device from its default Inf/NaN mode to the saturation mode, creates a
stream (which computes in the mode in force when it is created), turns the stream's
overflow detection on, reads the status (0: nothing has overflowed), resets it, reads it
again, and puts the original mode back before it cleans up. Like the vendor's program, it
treats ACL_ERROR_RT_FEATURE_NOT_SUPPORT from the mode and switch calls as "not available
here": it warns, cleans up and ends successfully. It exits 1 when a call fails or a value
it reads back is not the one it set (the mode, the switch, the status after the reset)."""

import ctypes
import sys

import acl

ACL_SUCCESS = 0
ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_RT_OVERFLOW_MODE_SATURATION = 0
ACL_RT_OVERFLOW_MODE_INFNAN = 1
ACL_RT_OVERFLOW_MODE_UNDEF = 2
STATUS_SIZE = 64
DEVICE_ID = 0

MODE_NAMES = {
    ACL_RT_OVERFLOW_MODE_SATURATION: "ACL_RT_OVERFLOW_MODE_SATURATION",
    ACL_RT_OVERFLOW_MODE_INFNAN: "ACL_RT_OVERFLOW_MODE_INFNAN",
    ACL_RT_OVERFLOW_MODE_UNDEF: "ACL_RT_OVERFLOW_MODE_UNDEF",
}


class Failed(Exception):
    """A call returned an error or a value is wrong: the program cleans up and exits 1."""


def info(text):
    print(f"[INFO]  {text}")


def warn(text):
    print(f"[WARN]  {text}")


def error(text):
    print(f"[ERROR]  {text}")


def check(ret, what):
    if ret != ACL_SUCCESS:
        error(f"{what} failed with error code {ret}")
        raise Failed(what)


def available(ret, what, why):
    """True when `ret` is success; False (with a warning) when the feature is missing."""
    if ret == ACL_SUCCESS:
        return True
    if ret == ACL_ERROR_RT_FEATURE_NOT_SUPPORT:
        warn(f"{what} is not available here (error code {ret}): {why}")
        return False
    check(ret, what)
    return False


def expect(got, wanted, what):
    if got != wanted:
        error(f"{what} is {got}, expected {wanted}")
        raise Failed(what)


def mode_name(mode):
    return MODE_NAMES.get(mode, "ACL_RT_OVERFLOW_MODE_UNKNOWN")


def read_status(buffer, stream):
    """Asks the stream for the overflow status, waits for it and reads its first word."""
    check(acl.rt.get_overflow_status(buffer, STATUS_SIZE, stream), "acl.rt.get_overflow_status")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    host = ctypes.create_string_buffer(STATUS_SIZE)
    ret = acl.rt.memcpy(
        ctypes.addressof(host), STATUS_SIZE, buffer, STATUS_SIZE, ACL_MEMCPY_DEVICE_TO_HOST
    )
    check(ret, "acl.rt.memcpy")
    return int.from_bytes(host.raw[:4], "little")


def probe(state):
    """The sample's steps; `state` records what the cleanup has to undo."""
    check(acl.init(), "acl.init")
    state["initialized"] = True
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    state["device"] = True
    context, ret = acl.rt.create_context(DEVICE_ID)
    check(ret, "acl.rt.create_context")
    state["context"] = context

    original, ret = acl.rt.get_device_sat_mode()
    if not available(ret, "acl.rt.get_device_sat_mode", "the device has no saturation mode"):
        warn("Overflow detection is not available here; the sample stops after probing.")
        return
    state["original_mode"] = original
    ret = acl.rt.set_device_sat_mode(ACL_RT_OVERFLOW_MODE_SATURATION)
    why = "stream overflow detection needs the saturation mode, which this device lacks"
    if not available(ret, "acl.rt.set_device_sat_mode(ACL_RT_OVERFLOW_MODE_SATURATION)", why):
        warn("Overflow detection is not available here; the sample stops after probing.")
        return
    state["mode_changed"] = True
    current, ret = acl.rt.get_device_sat_mode()
    check(ret, "acl.rt.get_device_sat_mode")
    info(f"Device saturation mode switched from {mode_name(original)} to {mode_name(current)}.")
    expect(current, ACL_RT_OVERFLOW_MODE_SATURATION, "the device's mode")

    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    state["stream"] = stream
    ret = acl.rt.set_stream_overflow_switch(stream, 1)
    why = "the device has no stream overflow detection in the saturation mode"
    if not available(ret, "acl.rt.set_stream_overflow_switch(stream, 1)", why):
        warn("Stream overflow detection is not available here; the sample stops after probing.")
        return
    flag, ret = acl.rt.get_stream_overflow_switch(stream)
    check(ret, "acl.rt.get_stream_overflow_switch")
    info(f"Overflow switch={flag}")
    expect(flag, 1, "the stream's overflow switch")

    buffer, ret = acl.rt.malloc(STATUS_SIZE, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    state["buffer"] = buffer
    info(f"Overflow status before reset={read_status(buffer, stream)}")
    check(acl.rt.reset_overflow_status(stream), "acl.rt.reset_overflow_status")
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    after = read_status(buffer, stream)
    info(f"Overflow status after reset={after}")
    expect(after, 0, "the overflow status after the reset")


def restore_mode(mode):
    """Puts the device's original mode back and reads it again; an ACL code (-1: not back)."""
    ret = acl.rt.set_device_sat_mode(mode)
    if ret != ACL_SUCCESS:
        return ret
    current, ret = acl.rt.get_device_sat_mode()
    if ret == ACL_SUCCESS and current != mode:
        error(f"the device's mode is {mode_name(current)} after restoring {mode_name(mode)}")
        return -1
    return ret


def clean_up(state):
    """Undoes what `probe` did, in the sample's order; False when a call failed."""
    steps = []
    if "buffer" in state:
        steps.append(("acl.rt.free", lambda: acl.rt.free(state["buffer"])))
    if state.get("mode_changed"):
        mode = state["original_mode"]
        steps.append(("acl.rt.set_device_sat_mode", lambda: restore_mode(mode)))
    if "stream" in state:
        steps.append(("acl.rt.destroy_stream", lambda: acl.rt.destroy_stream(state["stream"])))
    if "context" in state:
        steps.append(("acl.rt.destroy_context", lambda: acl.rt.destroy_context(state["context"])))
    if state.get("device"):
        steps.append(("acl.rt.reset_device_force", lambda: acl.rt.reset_device_force(DEVICE_ID)))
    if state.get("initialized"):
        steps.append(("acl.finalize", acl.finalize))
    ok = True
    for what, step in steps:
        ret = step()
        if ret != ACL_SUCCESS:
            error(f"{what} failed with error code {ret}")
            ok = False
    return ok


def main():
    state = {}
    try:
        probe(state)
        ok = True
    except Failed:
        ok = False
    if not clean_up(state) or not ok:
        return 1
    info("Overflow detection sample finished successfully.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
