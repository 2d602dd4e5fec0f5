"""After the CANN runtime's example/0_quickstart/3_cross_version/0_runtime_compatibility:
what a program checks before it relies on a runtime of some version -- the runtime
package's version, the CANN attributes it supports (acl.get_cann_attribute_list,
acl.get_cann_attribute), whether code built for this SoC can run here
(acl.rt.check_arch_compatibility) and one device capability
(acl.rt.get_device_capability).

The answers are simnpu's own: its version, SoC name ("simnpu-simulated-npu") and
attributes -- the list holds the supported ones only, infinities and NaNs (no bfloat16
kernels, no operator compilation) -- and no device capability of the TS CPU's task
updates.
"""

import sys

import acl

DEVICE_ID = 0
PACKAGE = "runtime"
ATTRIBUTE_NAMES = {
    acl.ACL_CANN_ATTR_INF_NAN: "ACL_CANN_ATTR_INF_NAN",
    acl.ACL_CANN_ATTR_BF16: "ACL_CANN_ATTR_BF16",
    acl.ACL_CANN_ATTR_JIT_COMPILE: "ACL_CANN_ATTR_JIT_COMPILE",
}


class Failed(Exception):
    """An acl call of a query step did not succeed."""


def check(ret, call):
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {call} failed with ret = {ret} ({acl.get_recent_err_msg()})")
        raise Failed(call)


def query_cann_version():
    version_str, ret = acl.sys.get_version_str(PACKAGE)
    check(ret, "acl.sys.get_version_str")
    version_num, ret = acl.sys.get_version_num(PACKAGE)
    check(ret, "acl.sys.get_version_num")
    print(f"[INFO] package {PACKAGE}: version {version_str}")
    print(f"[INFO] package {PACKAGE}: version number {version_num}")


def query_cann_attributes():
    attributes, ret = acl.get_cann_attribute_list()
    check(ret, "acl.get_cann_attribute_list")
    print(f"[INFO] CANN attributes: {len(attributes)}")
    for attribute in attributes[:3]:
        value, ret = acl.get_cann_attribute(attribute)
        check(ret, "acl.get_cann_attribute")
        name = ATTRIBUTE_NAMES.get(attribute, "ACL_CANN_ATTR_UNKNOWN")
        print(f"[INFO] CANN attribute {name}: {value}")


def query_compatibility_and_capability(device_id):
    soc_name = acl.get_soc_name()
    if not soc_name:
        print("[WARN] no SoC name: the architecture check is skipped")
    else:
        compatible, ret = acl.rt.check_arch_compatibility(soc_name)
        check(ret, "acl.rt.check_arch_compatibility")
        print(f"[INFO] code built for {soc_name} runs here: {compatible}")
        if compatible != 1:
            print(f"[ERROR] the device's own SoC {soc_name} is not compatible with it")
            raise Failed("acl.rt.check_arch_compatibility")
    capability, ret = acl.rt.get_device_capability(
        device_id, acl.ACL_FEATURE_TSCPU_TASK_UPDATE_SUPPORT_AIC_AIV
    )
    check(ret, "acl.rt.get_device_capability")
    print(f"[INFO] device capability ACL_FEATURE_TSCPU_TASK_UPDATE_SUPPORT_AIC_AIV: {capability}")


def main():
    if acl.init() != acl.ACL_SUCCESS or acl.rt.set_device(DEVICE_ID) != acl.ACL_SUCCESS:
        print(f"[ERROR] could not start: {acl.get_recent_err_msg()}")
        sys.exit(1)
    ok = True
    try:
        query_cann_version()
        query_cann_attributes()
        query_compatibility_and_capability(DEVICE_ID)
    except Failed:
        ok = False
    ret = acl.rt.reset_device_force(DEVICE_ID)
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] acl.rt.reset_device_force failed with ret = {ret}")
        ok = False
    ret = acl.finalize()
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] acl.finalize failed with ret = {ret}")
        ok = False
    if not ok:
        sys.exit(1)
    print("[INFO] runtime compatibility checks: all done")


if __name__ == "__main__":
    main()
