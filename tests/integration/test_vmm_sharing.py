"""Physical memory shared between two processes of one daemon (aclrtMemExportToShareableHandle,
aclrtMemSetPidToShareableHandle, aclrtMemImportFromShareableHandle and their V2 forms): the
pid whitelist, both processes mapping the same pages, and the memory living until the last
holder lets go."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import run_client

from simnpu.proto import codes

pytestmark = pytest.mark.multiprocess

MiB = 1 << 20
CHUNK = 2 * MiB
PROP = {
    "handle_type": 0,
    "allocation_type": 0,
    "mem_attr": codes.ACL_HBM_MEM_HUGE,
    "location": {"id": 0, "type": 1},
    "reserve": 0,
}
IMPORTER = f"""
    import sys
    import numpy as np
    import acl
    assert acl.rt.set_device(0) == 0
    pid, _ = acl.rt.device_get_bare_tgid()
    print(pid, flush=True)
    shareable = int(sys.stdin.readline())
    handle, ret = acl.rt.mem_import_from_shareable_handle(shareable, 0)
    print(ret, flush=True)
    if ret:
        raise SystemExit(0)
    prop, _ = acl.rt.mem_get_allocation_properties_from_handle(handle)
    base, _ = acl.rt.reserve_mem_address({CHUNK}, 0, 0, 0)
    assert acl.rt.map_mem(base, {CHUNK}, 0, handle, 0) == 0
    seen = np.zeros({CHUNK} // 4, np.float32)
    assert acl.rt.memcpy(seen.ctypes.data, {CHUNK}, base, {CHUNK}, 2) == 0
    print(float(seen.sum()), prop["mem_attr"], flush=True)
    assert acl.rt.memset(base, {CHUNK}, 0, {CHUNK}) == 0
    print("written", flush=True)
    sys.stdin.readline()  # the exporter has let go: the memory is still this process's
    assert acl.rt.memcpy(seen.ctypes.data, {CHUNK}, base, {CHUNK}, 2) == 0
    print(int(seen.any()), flush=True)
    assert acl.rt.unmap_mem(base) == 0
    assert acl.rt.free_physical(handle) == 0
    assert acl.rt.release_mem_address(base) == 0
    print("done", flush=True)
"""


def free_again(acl, free_before: int) -> None:
    """Wait until the device's free memory is back to `free_before`: a client that ended
    leaves when the daemon has closed its session, shortly after its exit."""
    deadline = time.monotonic() + 60
    while acl.rt.get_mem_info(1)[0] != free_before:
        assert time.monotonic() < deadline, "the memory was never freed"
        time.sleep(0.02)


def importer(daemon) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(IMPORTER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
    )


def ask(process: subprocess.Popen, line: str | None = None) -> str:
    if line is not None:
        process.stdin.write(line + "\n")
        process.stdin.flush()
    answer = process.stdout.readline().strip()
    assert answer, process.stderr.read()
    return answer


def test_sharing_with_a_whitelisted_pid(daemon, acl):
    free_before, _, _ = acl.rt.get_mem_info(1)
    handle, ret = acl.rt.malloc_physical(CHUNK, PROP, 0)
    assert ret == 0
    base, _ = acl.rt.reserve_mem_address(CHUNK, 0, 0, 0)
    assert acl.rt.map_mem(base, CHUNK, 0, handle, 0) == 0
    data = np.ones(CHUNK // 4, np.float32)
    assert acl.rt.memcpy(base, CHUNK, data.ctypes.data, CHUNK, 1) == 0
    shareable, ret = acl.rt.mem_export_to_shareable_handle(handle, 0, 0)
    assert ret == 0 and shareable
    assert acl.rt.mem_export_to_shareable_handle(handle, 0, 0) == (
        0,
        codes.ACL_ERROR_RT_PARAM_INVALID,
    )  # one shareable handle per handle
    assert acl.rt.mem_export_to_shareable_handle(handle, 2, 0)[1] == (codes.ACL_ERROR_INVALID_PARAM)
    refused = importer(daemon)  # not whitelisted
    ask(refused)
    assert int(ask(refused, str(shareable))) == codes.ACL_ERROR_RT_NO_PERMISSION
    assert refused.wait(60) == 0
    process = importer(daemon)
    try:
        pid = int(ask(process))
        assert acl.rt.mem_set_pid_to_shareable_handle(shareable, [pid]) == 0
        assert int(ask(process, str(shareable))) == 0
        total, attr = ask(process).split()
        assert float(total) == CHUNK // 4 and int(attr) == codes.ACL_HBM_MEM_HUGE
        assert ask(process) == "written"
        seen = np.ones(CHUNK // 4, np.float32)
        assert acl.rt.memcpy(seen.ctypes.data, CHUNK, base, CHUNK, 2) == 0
        assert not seen.any()  # the importer wrote the same pages
        assert acl.rt.unmap_mem(base) == 0
        assert acl.rt.free_physical(handle) == 0  # the importer still holds it
        assert acl.rt.release_mem_address(base) == 0
        assert ask(process, "go") == "0"  # its zeros: its pages were not given away
        assert ask(process) == "done"
        assert process.wait(60) == 0
    finally:
        process.kill()
        process.wait()
    free_again(acl, free_before)  # the last holder let go: freed


def test_sharing_without_pid_validation_v2(daemon, acl):
    free_before, _, _ = acl.rt.get_mem_info(1)
    handle, _ = acl.rt.malloc_physical(CHUNK, PROP, 0)
    default, fabric = (
        codes.ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT,
        codes.ACL_MEM_SHARE_HANDLE_TYPE_FABRIC,
    )
    assert acl.rt.mem_export_to_shareable_handle_v2(handle, 0, fabric) == (
        0,
        codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    )
    shareable, ret = acl.rt.mem_export_to_shareable_handle_v2(
        handle, codes.ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION, default
    )
    assert ret == 0
    assert acl.rt.mem_import_from_shareable_handle_v2(shareable, default, 0) == (
        0,
        codes.ACL_ERROR_RT_PARAM_INVALID,
    )  # its own exporter
    code = f"""
        import acl
        assert acl.rt.set_device(0) == 0
        handle, ret = acl.rt.mem_import_from_shareable_handle_v2({shareable}, {default}, 0)
        again = acl.rt.mem_import_from_shareable_handle_v2({shareable}, {default}, 0)[1]
        base, _ = acl.rt.reserve_mem_address({CHUNK}, 0, 0, 0)
        print(ret, again, acl.rt.map_mem(base, {CHUNK}, 0, handle, 0), acl.rt.memset(base, 8, 7, 8))
    """  # and ends without unmapping or freeing: its session's end does
    done = run_client(daemon.address, code)
    assert done.stdout.split() == ["0", str(codes.ACL_ERROR_RT_PARAM_INVALID), "0", "0"], (
        done.stderr
    )
    assert acl.rt.free_physical(handle) == 0
    free_again(acl, free_before)  # the importer's session end let go of its reference
    late = run_client(
        daemon.address,
        f"import acl\nacl.rt.set_device(0)\n"
        f"print(acl.rt.mem_import_from_shareable_handle({shareable}, 0)[1])",
    )
    assert late.stdout.split() == [str(codes.ACL_ERROR_RT_PARAM_INVALID)], late.stderr
