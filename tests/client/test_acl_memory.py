"""The acl facade's device-memory calls: IPC sharing between processes and stream-ordered
pools, with pyACL's return shapes and codes, against a real daemon."""

from __future__ import annotations

import pytest
from conftest import run_client

from simnpu.proto import codes

MiB = 1 << 20


def test_ipc_through_acl_in_two_processes(daemon, acl):
    ptr, ret = acl.rt.malloc(4096, codes.ACL_MEM_MALLOC_NORMAL_ONLY)
    assert ret == 0
    assert acl.rt.memset(ptr, 4096, 0x5A, 4096) == 0
    key, ret = acl.rt.ipc_mem_get_export_key(ptr, 4096, codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT)
    assert ret == 0 and 0 < len(key) < codes.ACL_IPC_MEM_KEY_LENGTH
    importer = f"""
        import ctypes, acl
        assert acl.rt.set_device(0) == 0
        pid, ret = acl.rt.device_get_bare_tgid()
        print(pid, ret, flush=True)
        ptr, ret = acl.rt.ipc_mem_import_by_key({key!r}, 0)
        print(ptr, ret)
        if ret == 0:
            host = ctypes.create_string_buffer(4096)
            print(
                acl.rt.memcpy(ctypes.addressof(host), 4096, ptr, 4096, 2), host.raw == b"Z" * 4096
            )
            print(acl.rt.ipc_mem_close({key!r}))
    """
    refused = run_client(daemon.address, importer)  # not whitelisted yet
    pid, ret = map(int, refused.stdout.split("\n")[0].split())
    assert ret == 0 and pid > 0
    assert refused.stdout.split("\n")[1] == f"0 {codes.ACL_ERROR_RT_NO_PERMISSION}", refused.stderr
    # A second importer process, whitelisted by a pid list that cannot name it in advance:
    # validation off for this key instead.
    open_key, ret = acl.rt.ipc_mem_get_export_key(
        ptr, 4096, codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
    )
    assert ret == 0
    allowed = run_client(daemon.address, importer.replace(repr(key), repr(open_key)))
    lines = allowed.stdout.split("\n")
    assert lines[1] == f"{ptr} 0", allowed.stderr
    assert lines[2:4] == ["0 True", "0"]
    assert acl.rt.ipc_mem_set_import_pid(key, [pid]) == 0
    assert acl.rt.ipc_mem_close(key) == 0
    assert acl.rt.ipc_mem_close(open_key) == 0
    assert acl.rt.free(ptr) == 0


def test_ipc_errors_come_back_as_codes(acl):
    assert acl.rt.ipc_mem_import_by_key("simnpu-ipc-none", 0) == (
        0,
        codes.ACL_ERROR_RT_PARAM_INVALID,
    )
    assert acl.rt.ipc_mem_close("simnpu-ipc-none") == codes.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.ipc_mem_get_export_key(0, 16, 0) == ("", codes.ACL_ERROR_INVALID_PARAM)
    ptr, _ = acl.rt.malloc(64, 0)
    assert (
        acl.rt.ipc_mem_get_export_key(ptr, 4096, 0)[1] == codes.ACL_ERROR_RT_PARAM_INVALID
    )  # too long
    assert (
        acl.rt.ipc_mem_get_export_key(ptr, 64, 7)[1] == codes.ACL_ERROR_RT_PARAM_INVALID
    )  # bad flags
    with pytest.raises(TypeError):
        acl.rt.ipc_mem_set_import_pid("k", "not pids")
    with pytest.raises(TypeError):
        acl.rt.ipc_mem_import_by_key(1234, 0)
    assert acl.rt.free(ptr) == 0


def test_mem_pool_through_acl(acl):
    stream, ret = acl.rt.create_stream()
    pool, ret = acl.rt.mem_pool_create({"max_size": 4 * MiB, "location": {"id": 0, "type": 1}})
    assert ret == 0 and pool
    ptr, ret = acl.rt.mem_pool_malloc_async(2 * MiB, pool, stream)
    assert ret == 0 and ptr
    assert acl.rt.memset_async(ptr, 2 * MiB, 1, 2 * MiB, stream) == 0
    assert acl.rt.mem_pool_get_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT) == (
        4 * MiB,
        0,
    )
    assert acl.rt.mem_pool_malloc_async(1 * MiB, pool, stream) == (
        0,
        codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
    )
    assert acl.rt.free(ptr) == codes.ACL_ERROR_RT_PARAM_INVALID  # pool memory: free_async only
    assert acl.rt.mem_pool_free_async(ptr, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.mem_pool_get_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT) == (0, 0)
    assert acl.rt.mem_pool_set_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD, MiB) == 0
    assert acl.rt.mem_pool_trim_to(pool, 0) == 0  # nothing unused to release
    assert acl.rt.mem_pool_free_async(ptr, stream) == codes.ACL_ERROR_RT_PARAM_INVALID  # twice
    assert acl.rt.mem_pool_destroy(pool) == 0
    assert acl.rt.mem_pool_destroy(pool) == codes.ACL_ERROR_RT_INVALID_HANDLE
    with pytest.raises(TypeError):
        acl.rt.mem_pool_create("not props")
    assert acl.rt.destroy_stream(stream) == 0
