"""One simulated device as the scheduler and the tasks see it: its memory segment, its AI
cores and copy engines, and the streams whose head waits for a free unit (its ready queues).

What manages its memory -- the allocator, the host's limit, reserved ranges and what is
mapped there -- extends it in server/memory/device_memory.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.server.core.executor import Unit, UnitKind

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.server.core.streams import Stream
    from simnpu.shm.region import Region


class Device:
    """Device `index`, whose memory is `region`; its units are driven by the scheduler."""

    def __init__(
        self, index: int, region: Region, ai_cores: int, copy_engines: int, first_core_id: int
    ):
        self.index = index
        self.region = region
        engines = first_core_id + ai_cores
        self.units: dict[UnitKind, list[Unit]] = {  # core ids are daemon-wide
            UnitKind.AI_CORE: [
                Unit(UnitKind.AI_CORE, index, i, first_core_id + i) for i in range(ai_cores)
            ],
            UnitKind.COPY_ENGINE: [
                Unit(UnitKind.COPY_ENGINE, index, i, engines + i) for i in range(copy_engines)
            ],
        }
        # streams whose head is device work for units of each kind, in the order they got there
        self.ready: dict[UnitKind, list[Stream]] = {kind: [] for kind in UnitKind}
        self.started = False  # its units' workers were launched (server/units/process_executor.py)
        # when each client last had AI-core work here, handed out or done (core_shares.py)
        self.core_clients: dict[Owner, float] = {}

    def all_units(self) -> list[Unit]:
        return [unit for units in self.units.values() for unit in units]
