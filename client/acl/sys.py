"""acl.sys: the version queries (aclsysGetVersionStr, aclsysGetVersionNum and the deprecated
aclsysGetCANNVersion).

The versions are simnpu's own, not a CANN release's: the package names known are "simnpu"
and "runtime" (simnpu stands in for it; by enum, ACL_PKG_NAME_CANN and ACL_PKG_NAME_RUNTIME);
any other package is not installed here (ACL_ERROR_INVALID_FILE, 100003, as ACL answers for
a package without a version file).
"""

from __future__ import annotations

from simnpu.client.facade import api
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


_PACKAGE_ENUMS = (codes.ACL_PKG_NAME_CANN, codes.ACL_PKG_NAME_RUNTIME)


@api("i", ({},), needs_session=False)
def get_cann_version(rt, name):
    """aclsysGetCANNVersion (deprecated: use get_version_str / get_version_num): `version,
    ret`, the aclCANNPackageVersion struct as a dict of strings (`version`, `major_version`,
    `minor_version`, `release_version`, `patch_version`: the version's dot-separated parts,
    "0" where it has fewer than four, as ACL fills them). Does not block."""
    if not codes.ACL_PKG_NAME_CANN <= name <= codes.ACL_PKG_NAME_DRIVER:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"package name enum id {name} is invalid")
    if name not in _PACKAGE_ENUMS:
        raise NpuError(
            codes.ACL_ERROR_INVALID_FILE,
            f"package {name} is not installed: the simulated NPU knows ACL_PKG_NAME_CANN and "
            "ACL_PKG_NAME_RUNTIME (simnpu's own version)",
        )
    parts = [*_identity.VERSION.split("."), "0", "0", "0"][:4]
    keys = ("major_version", "minor_version", "release_version", "patch_version")
    return {"version": _identity.VERSION, **dict(zip(keys, parts, strict=True))}


UNSUPPORTED: list[str] = []  # every aclsys call is simulated

__getattr__, __dir__ = _on_demand(globals())
