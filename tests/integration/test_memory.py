"""Device memory through a real daemon: stats and snapshot, frees, out-of-memory reports,
per-client limits, IPC sharing between processes, and the `simnpu memory` tool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import run_client

from simnpu.proto import codes

MiB = 1 << 20
PAGE = 4096  # every block takes whole pages (docs/kernel-isolation.md)

pytestmark = pytest.mark.multiprocess


class Peer:
    """Another client process, driven line by line over its stdin/stdout."""

    def __init__(self, address: str, code: str, env=None):
        self.process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "SIMNPU_ADDRESS": address, **(env or {})},
        )

    def send(self, line) -> None:
        try:
            self.process.stdin.write(f"{line}\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):  # it ended; read()/finish() will say how
            pass

    def read(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(30)
            raise AssertionError(
                f"peer ended ({self.process.returncode}):\n{self.process.stderr.read()}"
            )
        return line.strip()

    def finish(self) -> str:
        """Close its stdin, wait for it to exit 0; its remaining output."""
        out, err = self.process.communicate(timeout=60)
        assert self.process.returncode == 0, err
        return out

    def kill(self) -> None:
        """Make sure it is gone (idempotent)."""
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.communicate(timeout=30)
        except ValueError:  # communicate() already ran
            self.process.wait(30)


PEER_PRELUDE = """
    import sys
    import numpy as np
    import simnpu.client as npu
    from simnpu.client.device import runtime
    npu.Device(0)
    rt = runtime()
    def say(*values):
        print(*values, flush=True)
    def wait():
        return sys.stdin.readline().strip()
"""


def peer(address, body, env=None) -> Peer:
    return Peer(address, textwrap.dedent(PEER_PRELUDE) + textwrap.dedent(body), env)


# ---- statistics, snapshot, frees --------------------------------------------------------------


def test_stats_and_snapshot_follow_malloc_and_free(npu):
    device = npu.Device(0)
    before = device.memory_stats()
    a = npu.DeviceBuffer(1000, codes.ACL_MEM_MALLOC_NORMAL_ONLY)
    b = npu.DeviceBuffer(3 * MiB)  # HUGE_FIRST over 1 MiB: two 2 MiB granules
    stats = device.memory_stats()
    assert stats["allocation.all.current"] == before["allocation.all.current"] + 2
    assert (
        stats["allocated_bytes.all.current"]
        == before["allocated_bytes.all.current"] + PAGE + 4 * MiB  # 1000 -> 1056 -> a page
    )
    assert stats["allocated_bytes.huge.current"] == before["allocated_bytes.huge.current"] + 4 * MiB
    assert (
        stats["requested_bytes.all.current"]
        == before["requested_bytes.all.current"] + 1000 + 3 * MiB
    )
    assert 0 < stats["largest_free_block"] <= stats["free_bytes"]
    mine = [blk for blk in device.memory_snapshot() if blk["pid"] == os.getpid()]
    assert {(blk["address"], blk["size"], blk["reserved"], blk["huge"]) for blk in mine} == {
        (a.ptr, 1000, PAGE, False),
        (b.ptr, 3 * MiB, 4 * MiB, True),
    }
    assert all(
        blk["owner"].startswith(f"session {blk['session']} (pid {os.getpid()} ") for blk in mine
    )
    a.free()
    b.free()  # returns before the daemon frees; the next call is ordered after it
    after = device.memory_stats()
    assert after["allocation.all.current"] == before["allocation.all.current"]
    assert after["allocation.all.freed"] == before["allocation.all.freed"] + 2
    assert not [blk for blk in device.memory_snapshot() if blk["pid"] == os.getpid()]


def test_free_checks_run_on_the_client(npu):
    npu.Device(0)
    rt = npu.runtime()
    ptr = rt.memory.malloc(4096)
    free_before, total = rt.memory.get_mem_info()
    rt.memory.free(ptr)
    with pytest.raises(npu.NpuError) as error:
        rt.memory.free(ptr)
    assert error.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    assert "double free" in error.value.message
    with pytest.raises(npu.NpuError) as error:
        rt.memory.free(ptr + 64)
    assert error.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    assert rt.memory.get_mem_info() == (free_before + 2 * PAGE, total)  # 4096 + 32 -> two pages
    rt.sync.synchronize_device()  # nothing deferred went wrong


def test_out_of_memory_report_names_the_request_the_usage_and_the_largest_block(daemon, npu):
    holder = peer(
        daemon.address,
        """
        big = npu.DeviceBuffer(200 << 20)
        say(rt.memory.device_get_bare_tgid())
        wait()
    """,
    )
    try:
        holder_pid = int(holder.read())
        npu.Device(0)
        with pytest.raises(npu.NpuMemoryError) as error:
            npu.DeviceBuffer(100 * MiB, codes.ACL_MEM_MALLOC_NORMAL_ONLY)
        assert isinstance(error.value, MemoryError)
        assert error.value.code == codes.ACL_ERROR_RT_MEMORY_ALLOCATION == 207001
        message = error.value.message
        assert f"asked {100 * MiB} B" in message and "ACL_MEM_MALLOC_NORMAL_ONLY" in message
        assert "held by this client: 0 B, by 1 other client(s): 2" in message
        assert f"pid {holder_pid}" not in message  # who holds it is the daemon log's to say
        assert "largest free block" in message
        assert "memory limit" not in message
        assert npu.Device(0).memory_stats()["num_ooms"] >= 1
        holder.send("done")
        holder.finish()
    finally:
        holder.kill()


# ---- per-client limits ------------------------------------------------------------------------


def test_limits_default_lowered_by_env_and_api_and_never_raised(start_daemon):
    npud = start_daemon("--memory-limit", "32MiB")
    result = run_client(
        npud.address,
        """
        import simnpu.client as npu
        from simnpu.client.device import runtime
        from simnpu.proto import codes
        dev = npu.Device(0)
        rt = runtime()
        assert rt.memory.get_mem_info() == (32 << 20, 32 << 20), rt.memory.get_mem_info()
        assert dev.memory_limit == 32 << 20
        a = npu.DeviceBuffer((16 << 20) - 64, codes.ACL_MEM_MALLOC_NORMAL_ONLY)
        assert rt.memory.get_mem_info() == (16 << 20, 32 << 20)
        try:
            npu.DeviceBuffer(20 << 20, codes.ACL_MEM_MALLOC_NORMAL_ONLY)
        except npu.NpuMemoryError as error:
            assert error.code == 207001 and "memory limit" in error.message, error.message
            assert f"may reserve {32 << 20} B" in error.message
        else:
            raise AssertionError("the limit was not enforced")
        dev.set_memory_limit(8 << 20)  # below what it holds: nothing more fits
        assert rt.memory.get_mem_info() == (0, 8 << 20)
        assert rt.memory.memory_limit() == (8 << 20, 16 << 20, 32 << 20)
        try:
            dev.set_memory_limit(64 << 20)
        except npu.NpuError as error:
            assert error.code == codes.ACL_ERROR_RT_PARAM_INVALID, error
        else:
            raise AssertionError("a client raised its limit past the daemon's")
        dev.set_memory_limit(0)  # back to the default
        assert rt.memory.get_mem_info() == (16 << 20, 32 << 20)
        print("ok")
    """,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    lowered = run_client(
        npud.address,
        """
        from simnpu.client.device import runtime
        import simnpu.client as npu
        npu.Device(0)
        print(runtime().memory.get_mem_info())
    """,
        env={"SIMNPU_MEMORY_LIMIT": "8MiB"},
    )
    assert lowered.returncode == 0, lowered.stderr
    assert lowered.stdout.strip() == f"({8 * MiB}, {8 * MiB})"
    refused = run_client(
        npud.address,
        """
        import simnpu.client as npu
        try:
            npu.Device(0)
        except npu.NpuError as error:
            print(error.code)
    """,
        env={"SIMNPU_MEMORY_LIMIT": "64MiB"},
    )
    assert refused.stdout.strip() == str(codes.ACL_ERROR_RT_PARAM_INVALID), refused.stderr


def test_each_client_has_its_own_limit(start_daemon):
    npud = start_daemon("--memory-limit", "25%")  # of 256 MiB
    holders = [
        peer(
            npud.address,
            """
        buffers = [npu.DeviceBuffer((60 << 20) - 64, 2)]
        say(rt.memory.get_mem_info()[1])
        wait()
    """,
        )
        for _ in range(2)
    ]
    try:
        assert [h.read() for h in holders] == [str(64 * MiB)] * 2  # 120 MiB held in all
        for h in holders:
            h.send("done")
            h.finish()
    finally:
        for h in holders:
            h.kill()


# ---- IPC memory ---------------------------------------------------------------------------------

IMPORTER = """
    say(rt.memory.device_get_bare_tgid())
    key = wait()
    shared = npu.DeviceBuffer.ipc_import(key)
    data = shared.to_numpy(np.float32)
    say(int(data[0]), int(data[-1]), shared.nbytes)
    out = npu.DeviceBuffer(shared.nbytes)
    # a kernel on imported memory
    npu.builtin("relu_f32").launch(2, shared, out, shared.nbytes // 4)
    npu.current_stream().synchronize()
    say(int((out.to_numpy(np.float32) == np.maximum(data, 0)).all()))
    shared.copy_from_host(np.full(shared.nbytes // 4, 7, np.float32))
    say("written")
    wait()
    shared.free()  # aclrtIpcMemClose
    say("closed")
    wait()
"""


def test_two_processes_share_one_buffer(daemon, npu):
    npu.Device(0)
    values = np.arange(-512, 512, dtype=np.float32)
    exported = npu.DeviceBuffer.from_array(values)
    importer = peer(daemon.address, IMPORTER)
    try:
        pid = int(importer.read())
        key = exported.ipc_export(pids=[pid])
        assert len(key) < codes.ACL_IPC_MEM_KEY_LENGTH
        importer.send(key)
        assert importer.read() == f"-512 511 {values.nbytes}"
        assert importer.read() == "1"
        assert importer.read() == "written"
        assert (exported.to_numpy(np.float32) == 7).all()  # the importer's write, seen here
        [block] = [b for b in npu.Device(0).memory_snapshot() if b["address"] == exported.ptr]
        assert block["ipc"]["keys"] == [key] and len(block["ipc"]["importers"]) == 1
        assert f"(pid {pid} " in block["ipc"]["importers"][0]
        importer.send("close")
        assert importer.read() == "closed"
        exported.free()  # closes the key, then frees
        assert exported.ptr == 0
        stats = npu.Device(0).memory_stats()
        assert stats["ipc.exported_keys"] == 0 and stats["ipc.open_imports"] == 0
        importer.send("exit")
        importer.finish()
    finally:
        importer.kill()


def test_import_needs_the_whitelist_unless_validation_is_off(daemon, npu):
    npu.Device(0)
    rt = npu.runtime()
    ptr = rt.memory.malloc(4096)
    strict = rt.memory.ipc_mem_get_export_key(ptr, 4096, codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DEFAULT)
    open_key = rt.memory.ipc_mem_get_export_key(
        ptr, 1024, codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
    )
    result = run_client(
        daemon.address,
        f"""
        import simnpu.client as npu
        from simnpu.client.device import runtime
        npu.Device(0)
        rt = runtime()
        try:
            rt.memory.ipc_mem_import_by_key({strict!r})
        except npu.NpuError as error:
            print(error.code)
        ptr = rt.memory.ipc_mem_import_by_key({open_key!r})
        print(ptr == {ptr}, rt.allocations.size_of(ptr))
        try:
            rt.memory.free(ptr)
        except npu.NpuError as error:
            print("free", error.code)
        try:
            rt.memory.ipc_mem_import_by_key("simnpu-ipc-no-such-key")
        except npu.NpuError as error:
            print("unknown", error.code)
        rt.memory.ipc_mem_close({open_key!r})
    """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:4] == [
        str(codes.ACL_ERROR_RT_NO_PERMISSION),
        "True 1024",
        f"free {codes.ACL_ERROR_RT_PARAM_INVALID}",
        f"unknown {codes.ACL_ERROR_RT_PARAM_INVALID}",
    ]
    rt.memory.ipc_mem_close(strict)
    rt.memory.ipc_mem_close(open_key)
    rt.memory.free(ptr)


def _holding_importer(address):
    return peer(
        address,
        """
        say(rt.memory.device_get_bare_tgid())
        shared = npu.DeviceBuffer.ipc_import(wait())
        say("imported")
        wait()
        say(int((shared.to_numpy(np.uint8) == 5).all()))
        shared.free()
        say("closed")
        wait()
    """,
    )


def _block_at(device, address):
    return [b for b in device.memory_snapshot() if b["address"] == address]


def test_exporter_free_while_imported_keeps_the_memory_until_the_last_close(daemon, npu):
    device = npu.Device(0)
    rt = npu.runtime()
    ptr = rt.memory.malloc(1 * MiB, codes.ACL_MEM_MALLOC_NORMAL_ONLY)
    rt.memory.memset(ptr, MiB, 5, MiB)
    importer = _holding_importer(daemon.address)
    try:
        pid = int(importer.read())
        key = rt.memory.ipc_mem_get_export_key(ptr, MiB, 0)
        rt.memory.ipc_mem_set_import_pid(key, [pid])
        importer.send(key)
        assert importer.read() == "imported"
        rt.memory.free(ptr)  # out of ACL's order: importers should close first
        [block] = _block_at(device, ptr)
        assert block["ipc"]["held_after_free"] and block["pid"] == os.getpid()
        assert device.memory_stats()["ipc.held_blocks"] == 1
        late = run_client(
            daemon.address,
            f"""
            import simnpu.client as npu
            from simnpu.client.device import runtime
            npu.Device(0)
            try:
                runtime().memory.ipc_mem_import_by_key({key!r})
            except npu.NpuError as error:
                print(error.code)
        """,
        )
        assert late.stdout.strip() == str(codes.ACL_ERROR_RT_PARAM_INVALID), late.stderr
        importer.send("check")
        assert importer.read() == "1"  # still the exporter's bytes, not reused
        assert importer.read() == "closed"
        assert _block_at(device, ptr) == []  # the last close returned it to the pool
        assert device.memory_stats()["ipc.held_blocks"] == 0
        importer.send("exit")
        importer.finish()
    finally:
        importer.kill()


def test_exporter_killed_while_imported(daemon, npu):
    device = npu.Device(0)
    exporter = peer(
        daemon.address,
        """
        buf = npu.DeviceBuffer(1 << 20, 2)
        buf.fill(5)
        say(buf.ptr)
        say(buf.ipc_export(pids=[int(wait())]))
        wait()
    """,
    )
    importer = _holding_importer(daemon.address)
    try:
        address = int(exporter.read())
        exporter.send(importer.read())
        importer.send(exporter.read())
        assert importer.read() == "imported"
        exporter.process.send_signal(signal.SIGKILL)
        exporter.process.wait(30)
        deadline = time.monotonic() + 30  # the daemon ends the exporter's session on its own time
        while not _block_at(device, address)[0].get("ipc", {}).get("held_after_free"):
            assert time.monotonic() < deadline, "the exporter's session never ended"
            time.sleep(0.05)
        importer.send("check")
        assert importer.read() == "1"
        assert importer.read() == "closed"
        importer.send("exit")
        importer.finish()
        assert _block_at(device, address) == []  # nothing left behind by either
    finally:
        exporter.kill()
        importer.kill()


# ---- the command-line tool -----------------------------------------------------------------------


def _simnpu(*args, address):
    return subprocess.run(
        [sys.executable, "-m", "simnpu", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "SIMNPU_ADDRESS": address},
    )


def test_memory_stats_and_snapshot_on_the_command_line(daemon, npu):
    npu.Device(0)
    buffer = npu.DeviceBuffer(5000)
    try:
        stats = _simnpu("memory", "stats", "--json", address=daemon.address)
        assert stats.returncode == 0, stats.stderr
        figures = json.loads(stats.stdout)
        assert figures["allocation.all.current"] >= 1 and figures["capacity"] == 256 * MiB
        table = _simnpu("memory", "stats", address=daemon.address)
        assert table.returncode == 0 and "allocated_bytes.all.current" in table.stdout
        assert "largest_free_block" in table.stdout
        snapshot = _simnpu("memory", "snapshot", "--json", address=daemon.address)
        assert snapshot.returncode == 0, snapshot.stderr
        blocks = json.loads(snapshot.stdout)
        assert any(b["address"] == buffer.ptr and b["pid"] == os.getpid() for b in blocks)
        text = _simnpu("memory", "snapshot", address=daemon.address)
        assert f"{buffer.ptr:#x}" in text.stdout and f"pid {os.getpid()}" in text.stdout
        bad = _simnpu("memory", "stats", "--device", "3", address=daemon.address)
        assert bad.returncode != 0 and "device 3" in bad.stderr
    finally:
        buffer.free()


def test_memory_tool_without_a_daemon(tmp_path):
    result = _simnpu("memory", "stats", address=f"unix://{tmp_path}/none.sock")
    assert result.returncode != 0 and "no simnpu daemon" in result.stderr
    assert not list(tmp_path.iterdir())  # no daemon was started for it


def test_the_tools_do_not_load_the_daemon():
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import sys, simnpu.cli, simnpu.client.tools.memory_command\n"
                "print(sorted(m for m in sys.modules if m.startswith('simnpu.server')))"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


# ---- stream-ordered pools -----------------------------------------------------------------------


def test_pool_block_returns_when_its_stream_reaches_the_free(npu):
    import threading

    device = npu.Device(0)
    rt = npu.runtime()
    stream = rt.streams.create_stream()
    pool = rt.memory.mem_pool_create(max_size=8 * MiB)
    ptr = rt.memory.mem_pool_malloc_async(3 * MiB, pool, stream)
    rt.memory.memset_async(ptr, 3 * MiB, 1, 3 * MiB, stream)
    assert rt.memory.mem_pool_get_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT) == 4 * MiB
    gate = threading.Event()
    rt.callbacks.launch_host_func(stream, lambda _: gate.wait(60), None)  # holds the stream
    rt.memory.mem_pool_free_async(ptr, stream)
    [block] = _block_at(device, ptr)  # the stream has not reached the free yet
    assert block["pool"]["handle"] == pool
    with pytest.raises(npu.NpuError) as error:
        rt.memory.free(ptr)  # not aclrtFree's to release, and already freed asynchronously
    assert error.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    gate.set()
    rt.sync.synchronize_stream(stream)
    assert _block_at(device, ptr) == []
    assert rt.memory.mem_pool_get_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT) == 0
    assert rt.memory.mem_pool_get_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH) == 4 * MiB
    rt.memory.mem_pool_set_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_HIGH, 0)
    assert rt.memory.mem_pool_get_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_RESERVED_MEM_HIGH) == 0
    rt.memory.mem_pool_set_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD, 1 << 30)
    assert (
        rt.memory.mem_pool_get_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_RELEASE_THRESHOLD) == 1 << 30
    )
    with pytest.raises(npu.NpuMemoryError):  # maxSize caps the pool
        rt.memory.mem_pool_malloc_async(9 * MiB, pool, stream)
    rt.memory.mem_pool_trim_to(pool, 0)  # nothing unused to release: the pool holds only its blocks
    assert rt.memory.mem_pool_get_attr(pool, codes.ACL_RT_MEM_POOL_ATTR_USED_MEM_CURRENT) == 0
    left = rt.memory.mem_pool_malloc_async(1000, pool, stream)
    rt.memory.mem_pool_destroy(pool)  # frees what is left
    assert _block_at(device, left) == []
    rt.streams.destroy_stream(stream)
