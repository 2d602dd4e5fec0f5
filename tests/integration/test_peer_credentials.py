"""Who a client is: the daemon takes a client's pid from the operating system (the
credentials socket's SO_PEERCRED), never from what its hello claims; IPC whitelists hold
those pids, and IPC keys are shown only to their exporter."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import run_client

from simnpu.client.runtime import Runtime
from simnpu.client.tools.query import query
from simnpu.proto import codes

TOKEN = "peer-credentials-test-token"

# Imports KEY claiming to be process CLAIM (its hello says so); prints the outcome.
IMPORT_AS = """
import os
import sys
from simnpu.client.runtime import Runtime
from simnpu.proto.errors import NpuError

claim, key = int(sys.argv[1]), sys.argv[2]
if claim:
    os.getpid = lambda: claim  # what the hello carries
rt = Runtime()
rt.contexts.set_device(0)
print(rt.memory.device_get_bare_tgid())
try:
    address = rt.memory.ipc_mem_import_by_key(key)
    print("imported")
    rt.memory.ipc_mem_close(key)
except NpuError as error:
    print(error.code)
    print(error.message)
rt.close()
"""


def run_importer(address: str, key: str, claim: int = 0, env=None, prefix=()) -> list[str]:
    result = subprocess.run(
        [*prefix, sys.executable, "-c", IMPORT_AS, str(claim), key],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SIMNPU_ADDRESS": address, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def exporter(daemon):
    rt = Runtime(daemon.address)
    rt.contexts.set_device(0)
    yield rt
    rt.close()


def export(rt: Runtime, pids=None) -> tuple[int, str]:
    ptr = rt.memory.malloc(4096)
    flags = codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION if pids is None else 0
    key = rt.memory.ipc_mem_get_export_key(ptr, 4096, flags)
    if pids is not None:
        rt.memory.ipc_mem_set_import_pid(key, pids)
    return ptr, key


def test_the_bare_tgid_is_the_pid_the_daemon_sees(daemon, exporter):
    assert exporter.memory.device_get_bare_tgid() == os.getpid()
    [session] = [
        p
        for p in query("devices", address=daemon.address)["processes"]
        if p["session"] == exporter.session_id
    ]
    assert session["pid"] == os.getpid()


def test_claiming_a_whitelisted_pid_does_not_admit_an_importer(daemon, exporter):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        ptr, key = export(exporter, [bystander.pid])
        lines = run_importer(daemon.address, key, claim=bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()
    assert lines[0] != str(bystander.pid)  # its bare tgid is its own pid
    assert lines[1] == str(codes.ACL_ERROR_RT_NO_PERMISSION), lines
    assert f"verified pid {lines[0]}" in lines[2] and "whitelist" in lines[2]
    exporter.memory.ipc_mem_close(key)
    exporter.memory.free(ptr)


def test_a_whitelisted_importer_is_admitted(daemon, exporter):
    importer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import sys
            from simnpu.client.runtime import Runtime
            rt = Runtime()
            rt.contexts.set_device(0)
            print(rt.memory.device_get_bare_tgid(), flush=True)
            key = sys.stdin.readline().strip()
            rt.memory.ipc_mem_import_by_key(key)
            print("imported", flush=True)
            rt.memory.ipc_mem_close(key)
            rt.close()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
    )
    try:
        pid = int(importer.stdout.readline())
        assert pid == importer.pid
        ptr, key = export(exporter, [pid])
        out, _ = importer.communicate(key + "\n", timeout=120)
        assert out.strip() == "imported"
    finally:
        if importer.poll() is None:
            importer.kill()
            importer.wait()
    exporter.memory.ipc_mem_close(key)
    exporter.memory.free(ptr)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a new pid namespace needs root and unshare",
)
def test_a_client_in_another_pid_namespace_is_whitelisted_by_the_daemons_pid(daemon, exporter):
    """Inside the namespace the client is pid 1; the daemon sees (and whitelists) its pid in
    the daemon's namespace."""
    importer = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            sys.executable,
            "-c",
            textwrap.dedent("""
            import os
            import sys
            from simnpu.client.runtime import Runtime
            rt = Runtime()
            rt.contexts.set_device(0)
            print(os.getpid(), rt.memory.device_get_bare_tgid(), flush=True)
            key = sys.stdin.readline().strip()
            rt.memory.ipc_mem_import_by_key(key)
            print("imported", flush=True)
            rt.memory.ipc_mem_close(key)
            rt.close()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
    )
    try:
        own, seen = map(int, importer.stdout.readline().split())
        assert own == 1 and seen not in (0, 1)
        ptr, key = export(exporter, [seen])
        out, _ = importer.communicate(key + "\n", timeout=120)
        assert out.strip() == "imported"
    finally:
        if importer.poll() is None:
            importer.kill()
            importer.wait()
    exporter.memory.ipc_mem_close(key)
    exporter.memory.free(ptr)


def test_a_tcp_client_is_unverified_and_imports_only_keys_without_pid_validation(start_daemon):
    port = free_port()
    daemon = start_daemon("--listen", f"127.0.0.1:{port}", env={"SIMNPU_TOKEN": TOKEN})
    rt = Runtime(daemon.address)
    try:
        rt.contexts.set_device(0)
        env = {"SIMNPU_TOKEN": TOKEN}
        ptr, key = export(rt, [os.getpid()])
        lines = run_importer(f"127.0.0.1:{port}", key, claim=os.getpid(), env=env)
        assert lines[0] == "0"  # unverified
        assert lines[1] == str(codes.ACL_ERROR_RT_NO_PERMISSION), lines
        assert "could not verify" in lines[2]
        open_ptr, open_key = export(rt)
        assert run_importer(f"127.0.0.1:{port}", open_key, env=env)[1] == "imported"
        for k, p in ((key, ptr), (open_key, open_ptr)):
            rt.memory.ipc_mem_close(k)
            rt.memory.free(p)
    finally:
        rt.close()


def test_ipc_keys_are_shown_only_to_their_exporter(daemon, exporter):
    ptr, key = export(exporter)
    try:
        [mine] = [b for b in exporter.memory.memory_snapshot(0) if b["address"] == ptr]
        assert mine["ipc"]["keys"] == [key] and mine["ipc"]["key_count"] == 1
        [seen] = [
            b for b in query("memory_snapshot", address=daemon.address) if b["address"] == ptr
        ]  # simnpu memory snapshot: no session
        assert seen["ipc"]["keys"] == [] and seen["ipc"]["key_count"] == 1
        other = run_client(
            daemon.address,
            f"""
            import json
            from simnpu.client.runtime import Runtime
            rt = Runtime()
            rt.contexts.set_device(0)
            print(json.dumps([b for b in rt.memory.memory_snapshot(0) if b["address"] == {ptr}]))
            rt.close()
        """,
        )
        assert other.returncode == 0, other.stderr
        assert key not in other.stdout and '"key_count": 1' in other.stdout
        tool = subprocess.run(
            [sys.executable, "-m", "simnpu", "memory", "snapshot", "--address", daemon.address],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert tool.returncode == 0, tool.stderr
        assert key not in tool.stdout and "1 key(s)" in tool.stdout
    finally:
        exporter.memory.ipc_mem_close(key)
        exporter.memory.free(ptr)
