"""What the simulated NPU says it is: simnpu's own SoC name, version and CANN attributes.

None of these is a real chip's or a CANN release's: the device is simulated, and a program
that checks them learns so (docs/acl.md).
"""

from __future__ import annotations

from importlib import metadata

from simnpu.proto import codes

SOC_NAME = "simnpu-simulated-npu"
"""aclrtGetSocName: no Ascend chip; aclrtCheckArchCompatibility accepts only this name."""

try:
    VERSION = metadata.version("simnpu")
except metadata.PackageNotFoundError:  # a checkout that is not installed
    VERSION = "0.0.0"

PACKAGES = ("simnpu", "runtime")
"""The package names aclsysGetVersionStr knows: simnpu, which stands in for the runtime."""

CANN_ATTRIBUTES = {
    codes.ACL_CANN_ATTR_INF_NAN: 1,  # kernels compute with IEEE infinities and NaNs
    codes.ACL_CANN_ATTR_BF16: 0,  # no built-in kernel takes bfloat16
    codes.ACL_CANN_ATTR_JIT_COMPILE: 0,  # no operator compilation: kernels are Python
}


def version_parts() -> tuple[int, int, int]:
    """(major, minor, patch) of VERSION."""
    parts = [int("".join(c for c in part if c.isdigit()) or 0) for part in VERSION.split(".")[:3]]
    return (*parts, 0, 0, 0)[:3]  # type: ignore[return-value]


def version_number() -> int:
    """aclsysGetVersionNum's encoding: major * 10^7 + minor * 10^5 + patch * 10^3."""
    major, minor, patch = version_parts()
    return major * 10_000_000 + minor * 100_000 + patch * 1_000
