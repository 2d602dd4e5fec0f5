"""The VMM window table: every device's entries mapped at reserved addresses, which the
daemon's trusted units map too.

Physical blocks mapped by aclrtMapMem (the last at each offset, unmapped since or not) and
registered host memory (retired once unregistered) are entries (device, reserved offset,
length, source offset, source: simnpu.shm.window.Entry). The table has a version that
changes with them: the executor sends the table to a unit whose version is older before its
next batch (MapWindows, server/core/unit_protocol.py), so a mapping is visible to the next
batch of every unit. Kernel processes map their own windows (server/units/kernel_processes.py).
"""

from __future__ import annotations

import threading

from simnpu.shm import window


class WindowTable:
    """Every device's windows and their version. Read without a lock: both are replaced
    whole."""

    def __init__(self) -> None:
        self.version = 0
        self.entries: tuple[tuple[int, int, int, int, str], ...] = ()
        self._lock = threading.Lock()

    def update(self, device: int, mappings: set[window.Entry]) -> None:
        """Device `device`'s entries are `mappings` from now on."""
        with self._lock:
            others = tuple(entry for entry in self.entries if entry[0] != device)
            self.entries = others + tuple((device, *mapping) for mapping in mappings)
            self.version += 1
