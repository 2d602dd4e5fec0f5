"""What the scheduler runs work on: units (a device's AI cores and copy engines) and the
executor that carries batches to them and their reports back.

The scheduler depends on the `Executor` protocol only. The daemon's executor runs each unit
as a worker process (server/units/worker_main.py); unit tests use one that runs units in threads of
the test process. A `Unit` is the scheduler's book of one unit: what it runs now and since
when, which kernel modules it has loaded, and what the executor must have it unmap and map
before its next batch (`Windows`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from simnpu.server.core.owner import Owner
    from simnpu.shm.notify import StreamSignal


class UnitKind(enum.Enum):
    AI_CORE = "AI core"
    COPY_ENGINE = "copy engine"


class Unit:
    """One AI core or copy engine of a device. Only the scheduler changes it (under its lock)."""

    __slots__ = (
        "busy_ns",
        "core_id",
        "deadline",
        "device",
        "forget",
        "generation",
        "index",
        "inflight",
        "kind",
        "lent",
        "loaded",
        "ready",
        "restarts",
        "windows",
        "backing",
    )

    def __init__(self, kind: UnitKind, device: int, index: int, core_id: int):
        self.kind = kind
        self.device = device
        self.index = index
        self.core_id = core_id  # daemon-wide
        self.generation = 0  # bumped whenever the unit is restarted (its reports before are stale)
        self.restarts = 0
        self.busy_ns = 0  # time spent executing, for utilisation
        self.reset()

    def reset(self) -> None:
        """A fresh unit (at start, and at every restart)."""
        self.ready = False
        self.inflight: dict[int, Any] = {}  # token -> the work it belongs to, of the running batch
        self.deadline: float | None = None
        self.loaded: set[int] = set()  # binary ids whose module it has executed
        # what the executor sends a trusted unit before its next batch (Executor.send):
        self.forget: list[str] = []  # unlinked segments to unmap
        self.windows = -1  # the version of the window table it maps (Windows)
        self.backing = -1  # the version of the backing log it maps (BackingChanges)
        self.lent: StreamSignal | None = None  # the signal it writes after its batch, if any

    @property
    def name(self) -> str:
        return f"device {self.device} {self.kind.value} {self.index}"


class Executor(Protocol):
    """Carries batches to units and their reports back."""

    units: Sequence[Unit]

    def start(self, units: Sequence[Unit]) -> None:
        """Start `units` (at daemon start; the others later): each is ready once it reports
        Ready. May block while the executor itself starts."""

    def send(self, unit: Unit, batch: list, tenant: Owner | None = None) -> None:
        """Hand `unit` a batch (server/core/unit_protocol.py); a batch of `tenant`'s own kernels
        runs in a process of that client alone (server/units/kernel_processes.py). A trusted
        unit (no tenant) gets first what it must map: the segments it must forget
        (`Unit.forget`, ForgetSegment), the changes of which file backs device memory since
        its last batch (`BackingChanges`, MapBacking), and the window table if it changed
        (`Windows`, MapWindows), so a new block and an aclrtMapMem are visible to the next
        batch of every unit. Raises OSError if the unit (or the tenant's process) is gone."""

    def cancel(self, unit: Unit, tokens: list[int]) -> None:
        """Ask `unit` to skip kernels of its running batch (best effort)."""

    def wait(self, timeout_s: float) -> list[tuple[Unit, int, Any]]:
        """(unit, its generation, report) of what units reported, waiting up to `timeout_s`
        for one (or for wake()); the report is LOST when the unit is gone. Blocks; called by
        the scheduler thread only, without the scheduler lock."""

    def wake(self) -> None:
        """Make a wait() in progress return now."""

    def restart(self, unit: Unit) -> str:
        """Stop `unit` for good (it died or is stuck) and start a new one in its place; says
        how the old one ended ("exited with code 7", ...)."""

    def stop(self) -> None:
        """Stop every unit."""


class Windows(Protocol):
    """What trusted units map at reserved addresses (server/memory/window_table.py): the
    entries and a version that changes with them, which `Unit.windows` is compared with.
    Read without a lock: both are replaced whole."""

    @property
    def version(self) -> int: ...

    @property
    def entries(self) -> tuple[tuple[int, int, int, int, str], ...]: ...


class BackingChanges(Protocol):
    """Which file backs each page run of device memory, as a log of changes
    (server/memory/device_backing.py's BackingLog): `Unit.backing` is the version a unit
    has applied."""

    @property
    def version(self) -> int: ...

    def since(self, version: int) -> tuple[int, tuple[Any, ...], bool]:
        """(the version now, the changes after `version`, whether they are the whole map)."""


LOST = object()  # the report of a unit whose process (or thread) is gone
