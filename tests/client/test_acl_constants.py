"""acl's constants (real values, full names) and the documentation of unsupported calls."""

from __future__ import annotations

import pathlib

import acl
import acl.rt
from simnpu.proto import codes

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_values_match_the_acl_headers():
    """Spot checks against the CANN runtime's public headers (include/external/acl/ of
    https://gitcode.com/cann/runtime): acl_rt.h, acl_base_rt.h, error_codes/rt_error_codes.h."""
    expected = {
        "ACL_SUCCESS": 0,
        "ACL_ERROR_INVALID_PARAM": 100000,
        "ACL_ERROR_UNINITIALIZE": 100001,
        "ACL_ERROR_REPEAT_INITIALIZE": 100002,
        "ACL_ERROR_REPEAT_FINALIZE": 100037,
        "ACL_ERROR_API_NOT_SUPPORT": 200001,
        "ACL_ERROR_RT_PARAM_INVALID": 107000,
        "ACL_ERROR_RT_INVALID_DEVICEID": 107001,
        "ACL_ERROR_RT_CONTEXT_NULL": 107002,
        "ACL_ERROR_RT_STREAM_NO_CB_REG": 107015,
        "ACL_ERROR_RT_INVALID_HANDLE": 107017,
        "ACL_ERROR_RT_FEATURE_NOT_SUPPORT": 207000,
        "ACL_ERROR_RT_MEMORY_ALLOCATION": 207001,
        "ACL_ERROR_RT_REPORT_TIMEOUT": 507012,
        "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT": 507046,
        "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT": 507047,
        "ACL_MEM_MALLOC_HUGE_FIRST": 0,
        "ACL_MEM_MALLOC_HUGE_ONLY": 1,
        "ACL_MEM_MALLOC_NORMAL_ONLY": 2,
        "ACL_MEMCPY_HOST_TO_HOST": 0,
        "ACL_MEMCPY_HOST_TO_DEVICE": 1,
        "ACL_MEMCPY_DEVICE_TO_HOST": 2,
        "ACL_MEMCPY_DEVICE_TO_DEVICE": 3,
        "ACL_MEMCPY_DEFAULT": 4,
        "ACL_DDR_MEM": 0,
        "ACL_HBM_MEM": 1,
        "ACL_HBM_MEM_HUGE": 4,
        "ACL_MEM_P2P_HUGE1G": 17,
        "ACL_EVENT_SYNC": 0x1,
        "ACL_EVENT_TIME_LINE": 0x8,
        "ACL_EVENT_RECORDED_STATUS_NOT_READY": 0,
        "ACL_EVENT_RECORDED_STATUS_COMPLETE": 1,
        "ACL_EVENT_STATUS_COMPLETE": 0,
        "ACL_EVENT_STATUS_NOT_READY": 1,
        "ACL_STREAM_FAST_LAUNCH": 0x1,
        "ACL_STREAM_PERSISTENT": 0x4,
        "ACL_STREAM_STATUS_COMPLETE": 0,
        "ACL_STREAM_STATUS_NOT_READY": 1,
        "ACL_CONTINUE_ON_FAILURE": 0,
        "ACL_STOP_ON_FAILURE": 1,
        "ACL_CALLBACK_NO_BLOCK": 0,
        "ACL_CALLBACK_BLOCK": 1,
        "ACL_DEVICE": 0,
        "ACL_HOST": 1,
        "ACL_FLOAT": 0,
        "ACL_FLOAT16": 1,
        "ACL_BF16": 27,
    }
    for name, value in expected.items():
        assert getattr(acl, name) == value, name
    assert acl.SIMNPU_BUILTIN_BINARY == 1


def test_every_code_and_enum_is_exported_under_its_full_name():
    names = [name for name in dir(codes) if name.startswith("ACL_")]
    assert len(names) > 200
    for name in names:
        assert getattr(acl, name) == getattr(codes, name), name


def test_host_helpers():
    assert acl.float_to_float16(1.0) == 0x3C00 and acl.float_to_float16(-2.0) == 0xC000
    assert acl.float16_to_float(0x3C00) == 1.0 and acl.float16_to_float(0x7BFF) == 65504.0
    assert acl.float_to_float16(1e6) == 0x7C00  # saturates to +inf
    assert [
        acl.data_type_size(t)
        for t in (
            acl.ACL_FLOAT,
            acl.ACL_FLOAT16,
            acl.ACL_INT8,
            acl.ACL_INT64,
            acl.ACL_BF16,
            acl.ACL_STRING,
            999,
        )
    ] == [4, 2, 1, 8, 2, 0, 0]
    assert acl.get_soc_name() == "simnpu-simulated-npu"  # simnpu's own: no Ascend SoC
    major, minor, patch, ret = acl.get_version()
    assert ret == 0 and all(isinstance(part, int) for part in (major, minor, patch))


def test_docs_list_every_unsupported_call():
    page = (ROOT / "docs" / "acl.md").read_text(encoding="utf-8")
    missing = [
        name
        for name in acl.rt.UNSUPPORTED
        if f"`{name}`" not in page and f"`acl.rt.{name}`" not in page
    ]
    assert not missing, f"docs/acl.md does not list {missing}"
