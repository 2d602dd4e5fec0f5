"""docs/acl.md's table of every function the CANN runtime's headers declare, against the
code: each name once, implemented ones real calls, not supported ones in their module's
UNSUPPORTED list and returning 207000 through a real daemon, not provided ones absent with
the reason (docs/cann_functions.py renders the table; docs/cann_functions.txt is the list)."""

from __future__ import annotations

import collections
import re

import pytest
from conftest import DOCS, docs_script

cann = docs_script("cann_functions")
ROW = re.compile(
    r"^\| `(\w+)` \| `([\w.]+)` \| (implemented|not supported|not provided)(?:: (.+))? \|$"
)


def _rows() -> list[tuple[str, str, str, str]]:
    page = (DOCS / "acl.md").read_text(encoding="utf-8")
    table = page[page.index(cann.BEGIN) : page.index(cann.END)]
    return [match.groups() for line in table.splitlines() if (match := ROW.match(line))]


def _resolve(name: str):
    import acl

    value = acl
    for attribute in name.split(".")[1:]:
        value = getattr(value, attribute)
    return value


def _unsupported_list(name: str) -> list[str]:
    import acl

    module = {"acl": acl, "acl.rt": acl.rt, "acl.sys": acl.sys, "acl.mdl": acl.mdl}[
        name.rpartition(".")[0]
    ]
    return module.UNSUPPORTED


def test_the_list_holds_the_four_headers_with_their_commit():
    listed = cann.functions()
    text = cann.LIST.read_text(encoding="utf-8")
    assert re.search(r"commit [0-9a-f]{40}\b", text)
    assert {f.header for f in listed} == set(cann.HEADERS)
    names = [f.name for f in listed]
    assert len(names) == len(set(names)) > 400
    for name in ("aclrtMalloc", "aclrtMemcpyAsync", "aclInit", "aclrtMemPoolCreate"):
        assert name in names
    assert all(f.returns for f in listed)


def test_extraction_reads_declarations_not_comments_or_macros():
    header = """
#define ACL_FUNC_VISIBILITY __attribute__((visibility("default")))
/**
 * ACL_FUNC_VISIBILITY aclError aclrtInAComment(int x);
 */
// ACL_FUNC_VISIBILITY aclError aclrtInALineComment(int x);
ACL_DEPRECATED_MESSAGE("aclrtOld is deprecated, use aclrtNew instead")
ACL_FUNC_VISIBILITY aclError aclrtOld(int32_t* value);
ACL_FUNC_VISIBILITY aclError aclrtNew(
    int32_t deviceId, int64_t* value);
ACL_FUNC_VISIBILITY const char* aclrtGetSocName();
ACL_FUNC_VISIBILITY void aclAppLog(aclLogLevel logLevel, const char* fmt, ...);
#define ACL_APP_LOG(level, fmt, ...) aclAppLog(level, __FUNCTION__, fmt, ##__VA_ARGS__)
"""
    assert cann.declared(header) == [
        ("aclError", "aclrtOld"),
        ("aclError", "aclrtNew"),
        ("const char*", "aclrtGetSocName"),
        ("void", "aclAppLog"),
    ]


@pytest.mark.parametrize(
    ("c_name", "pyacl"),
    [
        ("aclrtMemcpyAsync", "acl.rt.memcpy_async"),
        ("aclrtIpcMemGetExportKey", "acl.rt.ipc_mem_get_export_key"),
        ("aclrtMemcpy2dAsync", "acl.rt.memcpy2d_async"),
        ("aclGetDataBufferSizeV2", "acl.get_data_buffer_size_v2"),
        ("aclrtUnSubscribeReport", "acl.rt.unsubscribe_report"),
        ("aclrtBinaryUnLoad", "acl.rt.binary_unload"),
        ("aclrtMemP2PMap", "acl.rt.mem_p2p_map"),
        ("aclrtDeviceGetPCIBusId", "acl.rt.device_get_pci_bus_id"),
        ("aclrtSetOpExecuteTimeOutV2", "acl.rt.set_op_execute_timeout_v2"),
        ("aclrtSetCurrentContext", "acl.rt.set_context"),
        ("aclsysGetVersionNum", "acl.sys.get_version_num"),
        ("aclmdlRICaptureBegin", "acl.mdl.ri_capture_begin"),
        ("aclFloat16ToFloat", "acl.float16_to_float"),
    ],
)
def test_c_names_become_pyacl_names(c_name, pyacl):
    assert cann.pyacl_name(c_name) == pyacl


def test_the_table_is_what_the_code_says():
    page = (DOCS / "acl.md").read_text(encoding="utf-8")
    assert cann.page_with(cann.render(), page) == page, (
        "docs/acl.md's table of the runtime's functions is out of date: run "
        "python docs/cann_functions.py"
    )


def test_every_declared_function_is_in_the_table_once_under_its_pyacl_name():
    rows = _rows()
    counts = collections.Counter(c_name for c_name, *_ in rows)
    declared = [f.name for f in cann.functions()]
    assert sorted(counts) == sorted(declared)
    assert [name for name, count in counts.items() if count > 1] == []
    assert [(c, py) for c, py, *_ in rows if cann.pyacl_name(c) != py] == []


def test_implemented_functions_are_real_calls():
    implemented = [py for _, py, kind, _ in _rows() if kind == "implemented"]
    assert len(implemented) > 100
    for name in implemented:
        value = _resolve(name)
        assert callable(value), name
        assert not getattr(value, "not_supported", False), f"{name} is a not-supported stub"
        assert name.rpartition(".")[2] not in _unsupported_list(name), name


def test_every_declared_function_is_provided_and_other_modules_say_why():
    """acl.mdl is provided (model run instances); modules simnpu does not simulate raise
    AttributeError saying so."""
    assert [py for _, py, kind, _ in _rows() if kind == "not provided"] == []
    import acl

    with pytest.raises(AttributeError, match="not provided by simnpu: single-operator"):
        _resolve("acl.op.execute")
    assert acl.mdl.load_from_file("model.om") == (0, acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    assert "offline models (.om files) are not simulated" in acl.get_recent_err_msg()


def test_not_supported_functions_return_207000_through_a_daemon(acl):
    returns = {f.name: f.returns for f in cann.functions()}
    rows = [(c, py, why) for c, py, kind, why in _rows() if kind == "not supported"]
    assert len(rows) > 150
    for c_name, name, why in rows:
        assert name.rpartition(".")[2] in _unsupported_list(name), name
        acl.rt.get_last_error()  # cleared: the call below leaves its own
        result = _resolve(name)(1, 2, 3)
        if returns[c_name] == "aclError":
            code = result if isinstance(result, int) else result[-1]
            assert code == acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, name
        else:  # no aclError: the value alone, the code kept as the thread's last error
            assert result in (0, None), name
            assert acl.rt.get_last_error() == acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT, name
        message = acl.get_recent_err_msg()
        assert f"{c_name} is not supported by the simulated NPU: {why}" in message, name
    # the session is unharmed: device memory still comes and goes
    ptr, ret = acl.rt.malloc(4096, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == 0 and ptr
    assert acl.rt.free(ptr) == 0


def test_unsupported_lists_name_their_stubs_once():
    import acl

    for module in (acl, acl.rt, acl.sys):
        names = module.UNSUPPORTED
        assert len(names) == len(set(names)), module.__name__
        for name in names:
            assert getattr(getattr(module, name), "not_supported", False), name


def test_get_soc_name_and_get_version_are_real(acl):
    assert acl.get_soc_name() == acl.rt.get_soc_name() == "simnpu-simulated-npu"
    major, minor, patch, ret = acl.get_version()
    assert ret == 0
    assert acl.sys.get_version_num("runtime") == (
        major * 10**7 + minor * 10**5 + patch * 10**3,
        0,
    )
