"""After the CANN runtime's example/1_basic_features/stream/3_stream_config_query.

A stream made from a stream config handle (aclrtCreateStreamV2): the handle's flag and
priority are set to 0, the stream is created from it, and its id, flags and priority are
read back (flags 0, priority 0; the id is the number the runtime gives the stream). The
stream is synchronized and destroyed, then the handle.
"""

import sys

import acl

DEVICE = 0
FLAGS = 0
PRIORITY = 0


def check(ret, call):
    if ret != 0:
        print(f"[ERROR]  {call} returned {ret}")
        sys.exit(1)


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(DEVICE), "acl.rt.set_device")

    config = acl.rt.create_stream_config_handle()
    if not config:
        print("[INFO]  [SKIP] no stream config handle could be made.")
        sys.exit(1)
    print("[INFO]  Stream config handle created.")
    check(
        acl.rt.set_stream_config_opt(config, acl.ACL_RT_STREAM_FLAG, FLAGS),
        "acl.rt.set_stream_config_opt(ACL_RT_STREAM_FLAG)",
    )
    check(
        acl.rt.set_stream_config_opt(config, acl.ACL_RT_STREAM_PRIORITY, PRIORITY),
        "acl.rt.set_stream_config_opt(ACL_RT_STREAM_PRIORITY)",
    )
    print(f"[INFO]  Config set: flags={FLAGS} priority={PRIORITY}")
    stream, ret = acl.rt.create_stream_v2(config)
    check(ret, "acl.rt.create_stream_v2")
    print("[INFO]  Stream created from the config.")

    stream_id, ret = acl.rt.stream_get_id(stream)
    check(ret, "acl.rt.stream_get_id")
    print(f"[INFO]  Stream id: {stream_id}")
    flags, ret = acl.rt.stream_get_flags(stream)
    check(ret, "acl.rt.stream_get_flags")
    print(f"[INFO]  Stream flags: {flags}")
    priority, ret = acl.rt.stream_get_priority(stream)
    check(ret, "acl.rt.stream_get_priority")
    print(f"[INFO]  Stream priority: {priority}")

    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")
    check(acl.rt.destroy_stream_config_handle(config), "acl.rt.destroy_stream_config_handle")
    check(acl.rt.reset_device_force(DEVICE), "acl.rt.reset_device_force")
    check(acl.finalize(), "acl.finalize")

    if (flags, priority) != (FLAGS, PRIORITY) or stream_id <= 0:
        print(f"[ERROR]  expected flags {FLAGS} and priority {PRIORITY}, got {flags}, {priority}")
        sys.exit(1)
    print("[INFO]  [SUCCESS] The stream config query program ran as expected.")


if __name__ == "__main__":
    main()
