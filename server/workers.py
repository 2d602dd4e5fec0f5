"""The daemon's executor: every unit a worker process (server/worker.py), spawned and
supervised here, its batches and reports on a pipe.

The scheduler thread sleeps in `wait`, one poll() over every worker pipe and a wake-up
pipe (rebuilt only when a worker is replaced), so an idle daemon burns no CPU. Sessions'
threads `send` under the scheduler lock; only the scheduler thread reads the pipes.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import select
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from simnpu.server import worker
from simnpu.server.executor import LOST, Unit
from simnpu.server.work import Cancel, Ready

_SPAWN = multiprocessing.get_context("spawn")
START_TIMEOUT_S = 60.0


class _Process:
    """One worker process and its pipe."""

    def __init__(self, unit: Unit, segments: list[str]):
        parent, child = _SPAWN.Pipe()
        self.process: BaseProcess = _SPAWN.Process(
            target=worker.main, args=(unit.core_id, segments, child),
            name=f"simnpu-{unit.kind.value.replace(' ', '-')}-{unit.device}.{unit.index}", daemon=True)
        self.process.start()
        child.close()
        self.conn: Connection = parent

    def ending(self) -> str:
        code = self.process.exitcode
        if code is None:
            return "stopped responding"
        return f"died with signal {-code}" if code < 0 else f"exited with code {code}"


class ProcessExecutor:
    """Worker processes for `units`, each mapping the device segments `segments`."""

    def __init__(self, units: Sequence[Unit], segments: list[str]):
        self.units = units
        self._segments = segments
        self._processes: dict[Unit, _Process] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller: select.poll | None = None  # rebuilt when a worker is replaced
        self._by_fd: dict[int, Unit] = {}

    def start(self) -> None:
        for unit in self.units:
            self._processes[unit] = _Process(unit, self._segments)
        deadline = time.monotonic() + START_TIMEOUT_S
        for unit in self.units:
            conn = self._processes[unit].conn
            if not conn.poll(max(deadline - time.monotonic(), 0)):
                raise RuntimeError(f"{unit.name} did not start within {START_TIMEOUT_S:.0f} s")
            report = conn.recv()
            if not isinstance(report, Ready):
                raise RuntimeError(f"{unit.name} sent {report!r} instead of Ready")
            unit.ready = True

    def send(self, unit: Unit, batch: list) -> None:
        try:
            self._processes[unit].conn.send(batch)
        except ValueError as error:  # a closed pipe
            raise OSError(str(error)) from None

    def cancel(self, unit: Unit, tokens: list[int]) -> None:
        try:
            self._processes[unit].conn.send(Cancel(tokens))
        except (OSError, ValueError):  # it died: its results never come, and it is replaced
            pass

    def wait(self, timeout_s: float) -> list[tuple[Unit, int, Any]]:
        if self._poller is None:
            self._rebuild_poller()
        by_fd = self._by_fd
        reports = []
        for fd, _ in self._poller.poll(math.ceil(timeout_s * 1000)):
            if fd == self._wake_r:
                try:
                    os.read(self._wake_r, 65536)
                except BlockingIOError:
                    pass
                continue
            unit = by_fd.get(fd)
            if unit is None:
                continue
            generation, process = unit.generation, self._processes[unit]
            try:
                reports.append((unit, generation, process.conn.recv()))
            except (EOFError, OSError):
                reports.append((unit, generation, LOST))
        return reports

    def _rebuild_poller(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        self._by_fd = {}
        for unit, process in self._processes.items():
            try:
                fd = process.conn.fileno()
            except OSError:  # closed: replaced meanwhile, the next rebuild has it
                continue
            self._by_fd[fd] = unit
            poller.register(fd, select.POLLIN)
        self._poller = poller

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    def restart(self, unit: Unit) -> str:
        old = self._processes[unit]
        if old.process.is_alive():
            old.process.kill()
        old.process.join(5)
        how = old.ending()
        old.conn.close()
        unit.generation += 1
        unit.restarts += 1
        unit.reset()
        self._processes[unit] = _Process(unit, self._segments)
        self._poller = None  # the scheduler thread polls the new pipe from its next wait
        self.wake()
        return how

    def stop(self) -> None:
        for process in self._processes.values():
            try:
                process.conn.send(None)
            except (OSError, ValueError):
                pass
        for process in self._processes.values():
            process.process.join(2.0)
            if process.process.is_alive():
                process.process.kill()
                process.process.join(2.0)
            process.conn.close()
        self._processes.clear()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
