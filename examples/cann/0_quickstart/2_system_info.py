"""After the CANN runtime's example/0_quickstart/2_system_info: what a program can learn
before it touches a device -- the installed runtime package's version (acl.sys), the run
mode, the half-precision conversions and the sizes of data types.

The versions are simnpu's own, not a CANN release's ("runtime" names simnpu, which stands
in for it).
"""

import sys

import acl

PACKAGE = "runtime"
ORIGINAL = 1.625
HALF_BITS = 0x3E80  # 1.625 in IEEE half precision: sign 0, exponent 15, mantissa 0x280
SIZES = {"ACL_FLOAT": 4, "ACL_FLOAT16": 2, "ACL_INT64": 8}


def check(ret, call):
    """Stop the program (status 1) when an acl call did not succeed."""
    if ret != acl.ACL_SUCCESS:
        print(f"[ERROR] {call} failed with ret = {ret} ({acl.get_recent_err_msg()})")
        sys.exit(1)


def print_version_info():
    """The package's version string and number; the number encodes the string."""
    version_str, ret = acl.sys.get_version_str(PACKAGE)
    check(ret, "acl.sys.get_version_str")
    version_num, ret = acl.sys.get_version_num(PACKAGE)
    check(ret, "acl.sys.get_version_num")
    print(f"[INFO] package {PACKAGE}: version {version_str}")
    print(f"[INFO] package {PACKAGE}: version number {version_num}")
    major, minor, patch = (int(part) for part in version_str.split(".")[:3])
    return version_num == major * 10_000_000 + minor * 100_000 + patch * 1_000


def main():
    check(acl.init(), "acl.init")
    print("[INFO] acl initialized")
    wrong = []
    if not print_version_info():
        wrong.append("the version number does not encode the version string")

    mode, ret = acl.rt.get_run_mode()
    check(ret, "acl.rt.get_run_mode")
    print(f"[INFO] run mode: {'ACL_HOST' if mode == acl.ACL_HOST else 'ACL_DEVICE'}")
    if mode != acl.ACL_HOST:
        wrong.append("the program does not run on the host")

    half = acl.float_to_float16(ORIGINAL)
    restored = acl.float16_to_float(half)
    print(f"[INFO] half precision: {ORIGINAL:.6f} -> {half:#06x} -> {restored:.6f}")
    if half != HALF_BITS or restored != ORIGINAL:
        wrong.append("the half-precision round trip")

    sizes = {name: acl.data_type_size(getattr(acl, name)) for name in SIZES}
    print("[INFO] element sizes: " + ", ".join(f"{name}={size}" for name, size in sizes.items()))
    if sizes != SIZES:
        wrong.append("the data type sizes")

    check(acl.finalize(), "acl.finalize")
    print("[INFO] acl finalized")
    for what in wrong:
        print(f"[ERROR] wrong: {what}")
    if wrong:
        sys.exit(1)


if __name__ == "__main__":
    main()
