"""After the CANN runtime's example/0_quickstart/1_error_handling: checking every return
code the same way, and the diagnostics a failed call leaves behind -- the thread's last
error code (acl.rt.peek_at_last_error reads it, acl.rt.get_last_error reads and clears
it), the latest error message (acl.get_recent_err_msg, cleared once read) and the
device's error summary (acl.rt.get_error_verbose).

The vendor example provokes the failure with aclrtGetRunMode(nullptr). A pyACL call has no
output pointer to pass as null (acl.rt.get_run_mode returns the mode), so this program
passes a null pointer where one is an input: acl.rt.free(0), the same invalid-parameter
error (ACL_ERROR_INVALID_PARAM, 100000).
"""

import sys

import acl

DEVICE_ID = 0


def check(ret, call):
    """Stop the program (status 1) when an acl call did not succeed."""
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {call} failed with ret = {ret}")
        sys.exit(1)


def run_mode_name(mode):
    return "ACL_HOST" if mode == acl.ACL_HOST else "ACL_DEVICE"


def or_null(message):
    return "<null>" if message is None else message


def print_verbose_error_info(device_id):
    """The device's error summary; a failure here is only a warning, as in the vendor example."""
    info, ret = acl.rt.get_error_verbose(device_id)
    if ret != acl.ACL_SUCCESS:
        print(f"[WARN] acl.rt.get_error_verbose({device_id}) returned {ret}")
        return
    print(
        f"[INFO] error summary: error_type={info['error_type']}, "
        f"try_repair={info['try_repair']}, has_detail={info['has_detail']}"
    )


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    print("[INFO] acl initialized, device set")

    mode, ret = acl.rt.get_run_mode()
    check(ret, "acl.rt.get_run_mode")
    print(f"[INFO] run mode: {run_mode_name(mode)}")

    print("[INFO] provoking an invalid-parameter error: acl.rt.free(0)")
    wrong = []
    expected_ret = acl.rt.free(0)
    if expected_ret == acl.ACL_SUCCESS:
        print("[WARN] acl.rt.free(0) succeeded, it was expected to fail")
        wrong.append("acl.rt.free(0) succeeded")
    else:
        peek_err = acl.rt.peek_at_last_error(acl.ACL_RT_THREAD_LEVEL)
        last_err = acl.rt.get_last_error(acl.ACL_RT_THREAD_LEVEL)
        message = acl.get_recent_err_msg()
        print(
            f"[ERROR] diagnostics: ret={expected_ret}, peek_err={peek_err}, "
            f"last_err={last_err}, recent_err_msg={or_null(message)}"
        )
        print_verbose_error_info(DEVICE_ID)

        cleared_peek = acl.rt.peek_at_last_error(acl.ACL_RT_THREAD_LEVEL)
        cleared_last = acl.rt.get_last_error(acl.ACL_RT_THREAD_LEVEL)
        cleared_message = acl.get_recent_err_msg()
        print(
            f"[INFO] read once, the diagnostics are gone: peek_err={cleared_peek}, "
            f"last_err={cleared_last}, recent_err_msg={or_null(cleared_message)}"
        )
        if expected_ret != acl.ACL_ERROR_INVALID_PARAM:
            wrong.append(f"ret {expected_ret}, not ACL_ERROR_INVALID_PARAM")
        if peek_err != expected_ret or last_err != expected_ret:
            wrong.append("the last error is not the failed call's code")
        if message is None:
            wrong.append("no error message")
        if (cleared_peek, cleared_last, cleared_message) != (
            acl.ACL_SUCCESS,
            acl.ACL_SUCCESS,
            None,
        ):
            wrong.append("the diagnostics were not cleared")

    check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")
    print("[INFO] acl finalized")
    for what in wrong:
        print(f"[ERROR] unexpected: {what}")
    if wrong:
        sys.exit(1)


if __name__ == "__main__":
    main()
