"""The daemon's side of a Gloo exchange process (server/hccl/gloo_exchange_main.py): the
exchange between the hosts of an HCCL world, started, fed and stopped by an
`ExchangeProcess`; its steps and reports are server/hccl/gloo_exchange_protocol.py's. This
module does not import torch; the exchange process is the only one that does, and the daemon
never imports its module.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from simnpu.server.core.executor import BackingChanges
from simnpu.server.hccl.gloo_exchange_protocol import (
    ExchangeLost,
    ExchangeSetup,
    Finish,
    Rebacked,
    Report,
    Step,
)
from simnpu.server.units.spawning import entry_point

_SPAWN = multiprocessing.get_context("spawn")
_EXCHANGE_MAIN = entry_point("simnpu.server.hccl.gloo_exchange_main:main")


class ExchangeProcess:
    """One world's exchange process on this host. `start` returns at once; what the process
    does comes to `on_report`, called from this object's reader thread: `StoreListening`
    (first host only), `Formed`, then one `StepDone` or `StepFailed` per step, and last
    `ExchangeLost`. Steps may be submitted before the world has formed; they run after."""

    def __init__(
        self,
        setup: ExchangeSetup,
        on_report: Callable[[Report], None],
        backing: BackingChanges,
    ):
        self.setup = setup
        self._on_report = on_report
        self._backing = backing  # which files back device memory: sent before each step
        self._backing_version = -1
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._send_lock = threading.Lock()

    def start(self) -> None:
        """Spawn the exchange process. Does not wait for it to form the world."""
        ours, theirs = _SPAWN.Pipe()
        self._process = _SPAWN.Process(
            target=_EXCHANGE_MAIN,
            args=(theirs, self.setup),
            name="simnpu-engine",
            daemon=True,
        )
        self._process.start()
        theirs.close()
        self._conn = ours
        threading.Thread(target=self._read, name="simnpu-engine-reports", daemon=True).start()

    def submit(self, step: Step) -> None:
        """Hand the exchange process one step; never blocks on the exchange. A step submitted
        after the process has ended is dropped: its `ExchangeLost` has come or is coming."""
        assert self._conn is not None, "ExchangeProcess.start first"
        with self._send_lock:
            try:
                if self._backing_version != self._backing.version:
                    self._backing_version, changes, whole = self._backing.since(
                        self._backing_version
                    )
                    self._conn.send(Rebacked(changes, whole))
                self._conn.send(step)
            except OSError:
                pass

    def stop(self, graceful: bool = False, timeout_s: float = 5.0) -> None:
        """End the exchange process and reap it; blocks until it has ended. `graceful`: after
        the steps submitted (a peer may still be reading what they sent), killed if that
        takes `timeout_s`; else at once, abandoning a step in flight."""
        process = self._process
        if process is None:
            return
        if graceful and process.is_alive():
            assert self._conn is not None
            with self._send_lock:
                try:
                    self._conn.send(Finish())
                except OSError:
                    pass
            process.join(timeout_s)
        if process.is_alive():
            process.kill()
        process.join(timeout_s)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _read(self) -> None:
        assert self._conn is not None and self._process is not None
        conn = self._conn
        while True:
            try:
                report = conn.recv()
            except (EOFError, OSError):
                break
            self._on_report(report)
        conn.close()
        self._process.join()
        self._on_report(ExchangeLost(self._process.exitcode))
