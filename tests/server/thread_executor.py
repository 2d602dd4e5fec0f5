"""An Executor for unit tests: every unit a thread of the test process, running the same
WorkRunner as the daemon's worker processes over plain bytearrays as device memory.

A test builds a Scheduler on it without a daemon, a socket or a process. A unit restarted
after a timeout cannot be killed (it is a thread): its thread runs on, and what it reports
carries its old generation, which the scheduler ignores, as it does a dead process's.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from simnpu.server.core.executor import Unit, UnitKind
from simnpu.server.core.unit_protocol import Cancel, Ready
from simnpu.server.units.runner import WorkRunner

_WAKE = object()


class Memory:
    """Device memory of `devices` devices of `size` bytes, named as the daemon names segments."""

    def __init__(self, devices: int = 1, size: int = 1 << 20):
        self.segments = [f"dev{index}" for index in range(devices)]
        self.maps = [bytearray(size) for _ in range(devices)]


class StandInDevice:
    """What the scheduler reads of a device: its units, its ready streams and who used its
    AI cores lately."""

    def __init__(self, index: int, ai_cores: int, copy_engines: int, first_core_id: int):
        self.index = index
        engines = first_core_id + ai_cores
        self.units = {
            UnitKind.AI_CORE: [
                Unit(UnitKind.AI_CORE, index, i, first_core_id + i) for i in range(ai_cores)
            ],
            UnitKind.COPY_ENGINE: [
                Unit(UnitKind.COPY_ENGINE, index, i, engines + i) for i in range(copy_engines)
            ],
        }
        self.ready: dict = {kind: [] for kind in UnitKind}
        self.core_clients: dict = {}  # when each client last had AI-core work here

    def all_units(self) -> list[Unit]:
        return [unit for units in self.units.values() for unit in units]


class ThreadExecutor:
    def __init__(self, units: Sequence[Unit], memory: Memory):
        self.units = units
        self.memory = memory
        self.batches: list[tuple[Unit, list]] = []  # every batch sent, in order (for tests)
        self._reports: queue.SimpleQueue = queue.SimpleQueue()
        self._inboxes: dict[Unit, queue.SimpleQueue] = {}
        self._threads: list[threading.Thread] = []

    def start(self, units) -> None:
        for unit in units:
            self._spawn(unit)
            unit.ready = True

    def _spawn(self, unit: Unit) -> None:
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._inboxes[unit] = inbox
        generation = unit.generation
        runner = WorkRunner(
            unit.core_id,
            self.memory.maps,
            self.memory.segments,
            lambda report: self._reports.put((unit, generation, report)),
        )
        thread = threading.Thread(
            target=self._serve,
            args=(unit, generation, inbox, runner),
            daemon=True,
            name=f"unit-{unit.core_id}-{generation}",
        )
        self._threads.append(thread)
        thread.start()

    def _serve(
        self, unit: Unit, generation: int, inbox: queue.SimpleQueue, runner: WorkRunner
    ) -> None:
        cancelled: set[int] = set()

        def take_cancellations() -> set[int]:
            while True:
                try:
                    message = inbox.get_nowait()
                except queue.Empty:
                    return cancelled
                if message is None:
                    raise SystemExit
                cancelled.update(message.tokens)

        while True:
            batch = inbox.get()
            if batch is None:
                return
            if isinstance(batch, Cancel):
                continue
            cancelled.clear()
            try:
                results = runner.run(batch, take_cancellations)
            except SystemExit:
                return
            self._reports.put((unit, generation, results))
            runner.wake_clients()

    def send(self, unit: Unit, batch: list, tenant: object = None) -> None:
        """Every batch runs in the unit's thread, a client's own kernels too (the daemon
        gives those processes of their own); units in threads map no window table, so
        nothing goes before a batch."""
        self.batches.append((unit, batch))
        self._inboxes[unit].put(batch)

    def cancel(self, unit: Unit, tokens: list[int]) -> None:
        self._inboxes[unit].put(Cancel(tokens))

    def wait(self, timeout_s: float) -> list:
        try:
            first = self._reports.get(timeout=timeout_s)
        except queue.Empty:
            return []
        reports = [first]
        while True:
            try:
                reports.append(self._reports.get_nowait())
            except queue.Empty:
                break
        return [report for report in reports if report is not _WAKE]

    def wake(self) -> None:
        self._reports.put(_WAKE)

    def restart(self, unit: Unit) -> str:
        self._inboxes[unit].put(None)  # the old thread ends after what it runs now
        unit.generation += 1
        unit.restarts += 1
        unit.reset()
        self._spawn(unit)
        self._reports.put((unit, unit.generation, Ready()))
        return "stopped responding"

    def stop(self) -> None:
        for inbox in self._inboxes.values():
            inbox.put(None)
        for thread in self._threads:
            thread.join(5)
