"""The host's limit on device memory (server/memory/host_memory.py), and what a device does when
the host refuses an allocation, without a daemon (fake figures, a small real segment)."""

from __future__ import annotations

import pytest

from simnpu.proto import codes
from simnpu.proto.errors import NpuMemoryError
from simnpu.server.memory import host_memory
from simnpu.server.memory.device_memory import DECOMMIT_MIN, DeviceWithMemory
from simnpu.server.memory.host_memory import HostMemory, read_meminfo, reserve_of

MiB = 1 << 20
GiB = 1 << 30


class Host:
    """Fake /proc/meminfo and /dev/shm figures, counting the readings."""

    def __init__(self, monkeypatch, available: int, shm: int, total: int = 24 * GiB):
        self.available, self.shm, self.total, self.reads = available, shm, total, 0
        monkeypatch.setattr(host_memory, "read_meminfo", self._meminfo)
        monkeypatch.setattr(host_memory, "shm_available_bytes", lambda directory: self.shm)

    def _meminfo(self) -> tuple[int, int]:
        self.reads += 1
        return self.total, self.available


def test_meminfo_is_read_in_bytes(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   1000 kB\n")
    assert read_meminfo(str(path)) == (24000000 * 1024, 1000 * 1024)
    total, available = read_meminfo()
    assert 0 < available <= total


def test_the_reserve_is_a_sixteenth_of_the_host_up_to_1_gib():
    assert reserve_of(4 * GiB) == 256 * MiB
    assert reserve_of(24 * GiB) == GiB


def test_an_allocation_past_dev_shm_is_207001_naming_it(monkeypatch):
    Host(monkeypatch, available=20 * GiB, shm=256 * MiB)
    memory = HostMemory()
    memory.check(64 * MiB)
    with pytest.raises(NpuMemoryError) as caught:
        memory.check(512 * MiB)
    assert caught.value.code == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    assert "/dev/shm has 268435456 B (256.00 MiB) free" in caught.value.message
    assert "shm_size" in caught.value.message


def test_an_allocation_past_mem_available_less_the_reserve_is_207001(monkeypatch):
    Host(monkeypatch, available=3 * GiB, shm=100 * GiB)
    memory = HostMemory()
    memory.check(2 * GiB)  # 3 GiB less the 1 GiB reserve
    with pytest.raises(NpuMemoryError) as caught:
        memory.check(2 * GiB + 4096)
    assert "MemAvailable less the reserve" in caught.value.message


def test_small_requests_use_a_recent_reading_less_what_was_committed_since(monkeypatch):
    host = Host(monkeypatch, available=20 * GiB, shm=8 * MiB)
    now = [100.0]
    memory = HostMemory(clock=lambda: now[0])
    memory.check(MiB)
    for _ in range(5):
        memory.check(MiB)  # the reading is recent: 2 MiB of it left
    memory.check(MiB + MiB // 2)
    assert host.reads == 1
    memory.check(MiB)  # more than the estimate: read again (8 MiB, nothing changed here)
    assert host.reads == 2
    now[0] += 0.2
    memory.check(4096)  # the reading is too old
    assert host.reads == 3
    host.shm = MiB
    memory.check(2 * MiB - 8192)  # the estimate allows it (it cannot know yet)...
    with pytest.raises(NpuMemoryError):
        memory.check(2 * MiB)  # ...from 2 MiB on, always read afresh
    assert host.reads == 4


class RefusingHost:
    def check(self, size: int) -> None:
        raise NpuMemoryError(f"out of host memory for device memory: asked {size}")


class AllowingHost(RefusingHost):
    def check(self, size: int) -> None:
        pass


@pytest.fixture
def device():
    made = []

    def make(host) -> DeviceWithMemory:
        made.append(DeviceWithMemory(0, 64 * MiB, 1, 1, 0, host))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_a_block_the_host_refuses_is_not_kept_and_counts_as_a_failure(device):
    dev = device(RefusingHost())
    with pytest.raises(NpuMemoryError):
        dev.allocate(4 * MiB, codes.ACL_MEM_MALLOC_NORMAL_ONLY, "a")
    stats = dev.allocator.stats()
    assert stats["num_ooms"] == 1
    assert stats["allocation.all.allocated"] == 0 and stats["allocated_bytes.all.allocated"] == 0
    assert dev.allocator.free_bytes == 64 * MiB and dev.used_by("a") == 0


def test_a_commit_the_host_refuses_is_207001_and_leaves_nothing(device, monkeypatch):
    dev = device(AllowingHost())

    def refuse(offset: int, length: int) -> None:
        raise OSError(14, "Bad address")

    monkeypatch.setattr(dev.region, "commit", refuse)
    with pytest.raises(NpuMemoryError) as caught:
        dev.allocate(4 * MiB, codes.ACL_MEM_MALLOC_NORMAL_ONLY, "a")
    assert "failed (Bad address)" in caught.value.message
    assert dev.allocator.free_bytes == 64 * MiB
    assert dev.allocator.stats()["num_ooms"] == 1


def test_frees_give_pages_back_from_a_free_block_of_2_mib(device):
    dev = device(AllowingHost())
    decommits = []
    region_decommit = dev.region.decommit

    def record(offset: int, length: int) -> None:
        decommits.append((offset, length))
        region_decommit(offset, length)

    dev.region.decommit = record  # type: ignore[method-assign]
    policy = codes.ACL_MEM_MALLOC_NORMAL_ONLY
    a, b, c = (dev.allocate(64 * 1024, policy, "a") for _ in range(3))
    dev.free(b)
    assert decommits == []  # 68 KiB between two live blocks
    dev.free(c)
    assert decommits == [(68 * 1024, 64 * MiB - 68 * 1024)]  # b's pages with the rest
    assert 64 * MiB - 68 * 1024 >= DECOMMIT_MIN
    dev.free(a)
    assert decommits[-1] == (0, 64 * MiB)
