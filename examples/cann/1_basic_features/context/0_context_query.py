"""After the CANN runtime's example/1_basic_features/context/0_context_query: one thread
on one device creates a context, makes it current and asks about it -- the current
context (the one it created), the context's default stream and the AI-core limits in
force for the thread -- then destroys it.

The names are pyACL's: aclrtSetCurrentContext is acl.rt.set_context and
aclrtGetCurrentContext acl.rt.get_context. The core limits are simnpu's device's own.
"""

import sys

import acl

DEVICE_ID = 0


class Failed(Exception):
    """An acl call did not succeed."""


def check(ret, call):
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {call} failed with ret = {ret} ({acl.get_recent_err_msg()})")
        raise Failed(call)


def run_context_query():
    context, ret = acl.rt.create_context(DEVICE_ID)
    check(ret, "acl.rt.create_context")
    try:
        check(acl.rt.set_context(context), "acl.rt.set_context")
        current, ret = acl.rt.get_context()
        check(ret, "acl.rt.get_context")
        if current != context:
            print("[ERROR] the current context is not the one just created")
            raise Failed("acl.rt.get_context")
        print("[INFO] the current context is the one created")

        default_stream, ret = acl.rt.ctx_get_current_default_stream()
        check(ret, "acl.rt.ctx_get_current_default_stream")
        print(f"[INFO] the context's default stream: {default_stream:#x}")

        cube_cores, ret = acl.rt.get_res_in_current_thread(acl.ACL_RT_DEV_RES_CUBE_CORE)
        check(ret, "acl.rt.get_res_in_current_thread(ACL_RT_DEV_RES_CUBE_CORE)")
        print(f"[INFO] cube cores this thread may use: {cube_cores}")
        vector_cores, ret = acl.rt.get_res_in_current_thread(acl.ACL_RT_DEV_RES_VECTOR_CORE)
        check(ret, "acl.rt.get_res_in_current_thread(ACL_RT_DEV_RES_VECTOR_CORE)")
        print(f"[INFO] vector cores this thread may use: {vector_cores}")
    except Failed:
        ret = acl.rt.destroy_context(context)  # released on the way out all the same
        if ret != acl.ACL_SUCCESS:
            print(f"[ERROR] acl.rt.destroy_context failed with ret = {ret}")
        raise
    check(acl.rt.destroy_context(context), "acl.rt.destroy_context")
    print("[INFO] context query: all done")


def main():
    try:
        check(acl.init(), "acl.init")
        check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    except Failed:
        sys.exit(1)
    ok = True
    try:
        run_context_query()
    except Failed:
        ok = False
    try:
        check(acl.rt.reset_device_force(DEVICE_ID), "acl.rt.reset_device_force")
        check(acl.finalize(), "acl.finalize")
    except Failed:
        ok = False
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
