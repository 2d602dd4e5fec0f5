"""acl.sys: the version queries (aclsysGetVersionStr, aclsysGetVersionNum).

The versions are simnpu's own, not a CANN release's: the package names known are "simnpu"
and "runtime" (simnpu stands in for it); any other package is not installed here
(ACL_ERROR_INVALID_FILE, 100003, as ACL answers for a package without a version file).
"""

from __future__ import annotations

from simnpu.client.facade import api, not_supported
from simnpu.client.facade import on_demand as _on_demand
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

from . import identity as _identity


def _package(pkg_name: str) -> None:
    if not pkg_name:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "pkgName is empty")
    if pkg_name not in _identity.PACKAGES:
        raise NpuError(
            codes.ACL_ERROR_INVALID_FILE,
            f"package {pkg_name!r} is not installed: the simulated NPU knows "
            f"{', '.join(_identity.PACKAGES)} (simnpu's own version)",
        )


@api("s", ("",), needs_session=False)
def get_version_str(rt, pkg_name):
    """aclsysGetVersionStr: `version_str, ret`, simnpu's version ("0.1.0")."""
    _package(pkg_name)
    return _identity.VERSION


@api("s", (0,), needs_session=False)
def get_version_num(rt, pkg_name):
    """aclsysGetVersionNum: `version_num, ret`, major * 10^7 + minor * 10^5 + patch * 10^3."""
    _package(pkg_name)
    return _identity.version_number()


get_cann_version = not_supported(
    "acl.sys.get_cann_version",
    "aclsysGetCANNVersion",
    "CANN packages are not installed with simnpu (deprecated: use get_version_str / "
    "get_version_num)",
    ({},),
)
UNSUPPORTED = ["get_cann_version"]

__getattr__, __dir__ = _on_demand(globals())
