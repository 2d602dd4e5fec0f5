"""One simulated device: its memory region, allocator, AI cores and copy engines."""

from __future__ import annotations

import threading

from simnpu.server.worker_pool import AI_CORE, COPY_ENGINE, WorkerHandle
from simnpu.shm.addresses import device_address, split_device_address
from simnpu.shm.allocator import Allocation, DeviceAllocator
from simnpu.shm.region import Region, segment_name


class Device:
    """Device `index`. Memory is owned here; workers are driven by the scheduler."""

    def __init__(self, index: int, memory_bytes: int, ai_cores: int, copy_engines: int):
        self.index = index
        self.region = Region.create(segment_name(f"dev{index}"), memory_bytes)
        self.allocator = DeviceAllocator(memory_bytes)
        self.lock = threading.Lock()  # guards the allocator: sessions allocate concurrently
        self.cores: list[WorkerHandle] = []
        self.engines: list[WorkerHandle] = []
        self.ai_core_count = ai_cores
        self.copy_engine_count = copy_engines
        self.ready_kernels: list = []  # streams whose head is a launch with blocks to hand out
        self.ready_copies: list = []   # streams whose head is a copy or memset

    def create_workers(self, region_names: list[str], first_core_id: int) -> list[WorkerHandle]:
        """Handles for this device's workers (not started). Core ids are daemon-wide."""
        self.cores = [WorkerHandle(AI_CORE, self.index, i, first_core_id + i, region_names)
                      for i in range(self.ai_core_count)]
        base = first_core_id + self.ai_core_count
        self.engines = [WorkerHandle(COPY_ENGINE, self.index, i, base + i, region_names)
                        for i in range(self.copy_engine_count)]
        return self.cores + self.engines

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    def allocate(self, size: int, policy: int, owner: object, limit: int | None = None) -> int:
        """aclrtMalloc on this device: the device address of a new allocation. `limit` caps
        what `owner` may have reserved in all (its memory quota)."""
        with self.lock:
            allocation = self.allocator.allocate(size, policy, owner, limit)
        return device_address(self.index, allocation.offset)

    def free(self, address: int) -> Allocation:
        _, offset = split_device_address(address)
        with self.lock:
            return self.allocator.free(offset)

    def used_by(self, owner: object) -> int:
        """Bytes `owner`'s live blocks reserve on this device."""
        with self.lock:
            return self.allocator.used_by(owner)

    def lookup(self, address: int) -> Allocation | None:
        """The live allocation containing `address`, if any."""
        _, offset = split_device_address(address)
        with self.lock:
            return self.allocator.lookup(offset)

    def close(self) -> None:
        self.region.close()
