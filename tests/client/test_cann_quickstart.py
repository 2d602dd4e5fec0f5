"""The programs after the CANN runtime's quick-start examples (examples/cann/0_quickstart/)
and its context query (1_basic_features/context/0_context_query) run against a daemon and
print the results the vendor examples show (simnpu's own version, SoC and core figures)."""

from __future__ import annotations

import re

from cann_examples import run_cann_example

from acl import identity
from simnpu.proto import codes

SUMS = [1.5, 3.0, 4.5, 6.0, 7.5, 9.0, 10.5, 12.0]


def _sums_printed(out: str) -> None:
    for i, value in enumerate(SUMS):
        assert f"  result[{i}] = {value:.1f} (expected {value:.1f})\n" in out


def test_hello_cann(daemon):
    out = run_cann_example(daemon.address, "0_quickstart/0_hello_cann.py")
    assert "  self:   [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]\n" in out
    assert "  other:  [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]\n" in out
    assert "  alpha:  1.0\n" in out
    assert re.search(r"output data buffer created at 0x[0-9a-f]+\n", out)
    assert "workspace size: 32\n" in out
    _sums_printed(out)
    assert out.endswith("hello_cann: all results match\n")


def test_error_handling(daemon):
    out = run_cann_example(daemon.address, "0_quickstart/1_error_handling.py")
    assert "[INFO] run mode: ACL_HOST\n" in out
    invalid = codes.ACL_ERROR_INVALID_PARAM
    assert re.search(
        rf"\[ERROR\] diagnostics: ret={invalid}, peek_err={invalid}, last_err={invalid}, "
        r"recent_err_msg=\S.*\n",
        out,
    )
    assert "[INFO] error summary: error_type=0, try_repair=0, has_detail=0\n" in out
    assert "peek_err=0, last_err=0, recent_err_msg=<null>\n" in out
    assert "unexpected" not in out


def test_system_info(daemon):
    out = run_cann_example(daemon.address, "0_quickstart/2_system_info.py")
    assert f"[INFO] package runtime: version {identity.VERSION}\n" in out
    assert f"[INFO] package runtime: version number {identity.version_number()}\n" in out
    assert "[INFO] run mode: ACL_HOST\n" in out
    assert "[INFO] half precision: 1.625000 -> 0x3e80 -> 1.625000\n" in out
    assert "[INFO] element sizes: ACL_FLOAT=4, ACL_FLOAT16=2, ACL_INT64=8\n" in out
    assert "[ERROR]" not in out


def test_runtime_compatibility(daemon):
    out = run_cann_example(
        daemon.address, "0_quickstart/3_cross_version/0_runtime_compatibility.py"
    )
    assert f"[INFO] package runtime: version {identity.VERSION}\n" in out
    assert f"[INFO] package runtime: version number {identity.version_number()}\n" in out
    # Only supported attributes are listed: simnpu's NPU has infinities and NaNs, no
    # bfloat16 kernels and no operator compilation.
    assert "[INFO] CANN attributes: 1\n" in out
    assert "[INFO] CANN attribute ACL_CANN_ATTR_INF_NAN: 1\n" in out
    assert "ACL_CANN_ATTR_BF16" not in out and "ACL_CANN_ATTR_JIT_COMPILE" not in out
    assert "[INFO] code built for simnpu-simulated-npu runs here: 1\n" in out
    assert "[INFO] device capability ACL_FEATURE_TSCPU_TASK_UPDATE_SUPPORT_AIC_AIV: 0\n" in out
    assert out.endswith("[INFO] runtime compatibility checks: all done\n")


def test_custom_kernel_launch(daemon):
    out = run_cann_example(daemon.address, "0_quickstart/4_custom_kernel_launch.py")
    assert "  self:   [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]\n" in out
    assert "custom kernel launched\nstream synchronized\n" in out
    _sums_printed(out)
    assert out.endswith("custom_kernel_launch: all results match\n")


def test_context_query(daemon):
    out = run_cann_example(daemon.address, "1_basic_features/context/0_context_query.py")
    assert "[INFO] the current context is the one created\n" in out
    assert re.search(r"\[INFO\] the context's default stream: 0x[0-9a-f]+\n", out)
    # The test daemon's device has 2 AI cores, and no limit is set.
    assert "[INFO] cube cores this thread may use: 2\n" in out
    assert "[INFO] vector cores this thread may use: 2\n" in out
    assert out.endswith("[INFO] context query: all done\n")
