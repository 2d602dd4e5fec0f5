"""Device memory at hardware scale through real daemons: devices far larger than the host's
/dev/shm, memory committed as it is allocated and given back as it is freed, workers that
start when a device is first used, and allocations the host cannot back failing cleanly
(docs/device-memory.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import round_trip, run_client, runtime_of

from simnpu.proto import codes, commands

MiB = 1 << 20
GiB = 1 << 30

pytestmark = pytest.mark.multiprocess


def committed(daemon, device: int) -> int:
    """Bytes of device `device`'s memory backed by pages: tmpfs blocks of its segment and
    of its clients' files (server/memory/device_backing.py)."""
    files = re.compile(rf"simnpu-{daemon.pid}(-s\d+)?-dev{device}")
    return sum(
        os.stat(f"/dev/shm/{name}").st_blocks * 512
        for name in os.listdir("/dev/shm")
        if files.fullmatch(name)
    )


def test_eight_devices_of_64_gib(start_daemon):
    """8 x 64 GiB starts on a host with far less /dev/shm; a 1 GiB block on device 7
    commits about 1 GiB, works for copies and kernels, and its pages go back at free."""
    from simnpu.client.runtime import Runtime

    daemon = start_daemon("--devices", "8", "--memory", "64GiB")
    held = sum(committed(daemon, d) for d in range(8))
    assert held < 64 * MiB, "nothing is committed before a client allocates"
    rt = Runtime(daemon.address)
    try:
        rt.contexts.set_device(7)
        assert rt.memory.get_mem_info() == (64 * GiB, 64 * GiB)
        big = rt.memory.malloc(GiB)
        grown = committed(daemon, 7)
        assert GiB <= grown < GiB + 16 * MiB
        rt.memory.memset(big, GiB, 1, GiB)  # the copy engines of the device, started on first use
        n = 1 << 16
        a = np.arange(n, dtype=np.float32)
        tail = big + GiB - 3 * a.nbytes
        rt.memory.memcpy(tail, a.nbytes, a.ctypes.data, a.nbytes, codes.ACL_MEMCPY_HOST_TO_DEVICE)
        rt.memory.memcpy(
            tail + a.nbytes, a.nbytes, a.ctypes.data, a.nbytes, codes.ACL_MEMCPY_HOST_TO_DEVICE
        )
        stream = rt.streams.create_stream()
        add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
        args = rt.kernels.signature(add).pack(tail, tail + a.nbytes, tail + 2 * a.nbytes, n)
        rt.kernels.launch_kernel(add, 2, args, stream)  # an AI core of device 7
        rt.sync.synchronize_stream(stream)
        out = np.zeros(n, np.float32)
        rt.memory.memcpy(
            out.ctypes.data,
            out.nbytes,
            tail + 2 * a.nbytes,
            out.nbytes,
            codes.ACL_MEMCPY_DEVICE_TO_HOST,
        )
        assert np.array_equal(out, 2 * a)
        ones = np.zeros(16, np.uint8)
        rt.memory.memcpy(ones.ctypes.data, 16, big, 16, codes.ACL_MEMCPY_DEVICE_TO_HOST)
        assert ones.tolist() == [1] * 16
        assert committed(daemon, 7) < GiB + 16 * MiB  # nothing beyond the block
        rt.streams.destroy_stream(stream)
        rt.memory.free(big)
        rt.sync.synchronize_device()  # the free has been done
        assert committed(daemon, 7) < 16 * MiB
        assert rt.memory.get_mem_info() == (64 * GiB, 64 * GiB)
    finally:
        rt.close()


def test_small_blocks_stay_committed_large_free_blocks_go_back(start_daemon):
    """A small block freed between live ones keeps its pages (reused warm); a free that
    leaves a free block of 2 MiB or more gives all of it back."""
    daemon = start_daemon("--memory", "1GiB")
    with runtime_of(daemon.address) as rt:
        policy = codes.ACL_MEM_MALLOC_NORMAL_ONLY
        first, middle, last = (rt.memory.malloc(64 * 1024, policy) for _ in range(3))
        before = committed(daemon, 0)
        rt.memory.free(middle)
        rt.sync.synchronize_device()
        assert committed(daemon, 0) == before  # 68 KiB between live blocks: kept
        big = rt.memory.malloc(64 * MiB, policy)
        assert committed(daemon, 0) >= before + 64 * MiB
        rt.memory.free(big)
        rt.memory.free(last)
        rt.sync.synchronize_device()  # last + big + the rest of the device: one free block
        assert committed(daemon, 0) <= before - 64 * 1024
        stats = rt.memory.memory_stats(0)
        assert stats["num_ooms"] == 0
        rt.memory.free(first)
        round_trip(rt)


def _small_shm_prefix(size: str) -> list[str]:
    """Run the daemon in a mount namespace of its own whose /dev/shm is a tmpfs of `size`."""
    return [
        "unshare",
        "--mount",
        "--",
        "sh",
        "-c",
        f'mount -t tmpfs -o size={size},mode=1777 simnpu-test /dev/shm && exec "$@"',
        "sh",
    ]


def _can_make_namespaces() -> str | None:
    """Why a daemon cannot be given a /dev/shm of its own here, or None if it can."""
    if os.geteuid() != 0:
        return "mounting a tmpfs in a private mount namespace needs root"
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    probe = subprocess.run(
        [*_small_shm_prefix("1m"), "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode:
        return f"unshare --mount with a tmpfs fails here: {probe.stderr.strip()}"
    return None


def test_allocation_the_host_cannot_back_fails_cleanly(start_daemon):
    """With a 256 MiB /dev/shm, 512 MiB of a 1 GiB device is 207001 naming /dev/shm; 64 MiB
    works; the daemon and its workers carry on."""
    reason = _can_make_namespaces()
    if reason:
        pytest.skip(reason)
    daemon = start_daemon("--memory", "1GiB", prefix=_small_shm_prefix("256m"))
    result = run_client(
        daemon.address,
        """
        import numpy as np
        from simnpu.client.runtime import Runtime
        from simnpu.proto import commands
        from simnpu.proto.errors import NpuError

        rt = Runtime()
        rt.contexts.set_device(0)
        try:
            rt.memory.malloc(512 << 20)
        except NpuError as error:
            print(error.code)
            print(error.message)
        else:
            raise SystemExit("512 MiB was allocated")
        p = rt.memory.malloc(64 << 20)
        data = np.arange(1 << 20, dtype=np.uint8)
        rt.memory.memcpy(p + (63 << 20), 1 << 20, data.ctypes.data, 1 << 20, 1)
        rt.memory.memset(p, 64 << 20, 7, 32 << 20)
        back = np.zeros(1 << 20, np.uint8)
        rt.memory.memcpy(back.ctypes.data, 1 << 20, p + (63 << 20), 1 << 20, 2)
        assert np.array_equal(back, data)
        a = rt.memory.malloc(4096)
        rt.memory.memset(a, 4096, 0, 4096)
        add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
        stream = rt.streams.create_stream()
        rt.kernels.launch_kernel(add, 1, rt.kernels.signature(add).pack(a, a, a, 1024), stream)
        rt.sync.synchronize_stream(stream)  # an AI core works
        rt.memory.free(a)
        rt.memory.free(p)
        print(rt.memory.memory_stats(0)["num_ooms"])
        rt.close()
        """,
        env={"SIMNPU_NO_SHM": "1"},  # the daemon's /dev/shm is not this process's
    )
    assert result.returncode == 0, result.stderr
    code, message, ooms = result.stdout.splitlines()
    assert int(code) == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    assert "out of host memory" in message and "/dev/shm has" in message
    assert int(ooms) == 1
    assert daemon.process.poll() is None


def test_a_dev_shm_without_room_for_a_staging_area_is_a_clear_error(tmp_path):
    """Devices need no /dev/shm to start; a client's staging area does."""
    reason = _can_make_namespaces()
    if reason:
        pytest.skip(reason)
    result = subprocess.run(
        [*_small_shm_prefix("16m"), sys.executable, "-m", "simnpu.server"]
        + ["--listen", f"unix://{tmp_path}/npu.sock", "--memory", "64GiB"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "/dev/shm has 16 MiB free but a client's staging area needs 32 MiB" in result.stderr
    assert not (tmp_path / "npu.sock").exists()
