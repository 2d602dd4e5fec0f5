"""The daemon's side of an engine process (server/hccl/gloo_exchange_main.py): the
exchange between the hosts of an HCCL world, started, fed and stopped by an `Engine`; its
steps and reports are server/hccl/gloo_exchange_protocol.py's. This module does not import
torch; the engine process is the only one that does, and the daemon never imports it.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

# The names marked F401 are worlds.py's: it takes them from here until it imports them from
# gloo_exchange_protocol.
from simnpu.server.hccl.gloo_exchange_protocol import (
    EngineLost,
    EngineSetup,
    Exchange,  # noqa: F401
    Finish,
    Formed,  # noqa: F401
    Gather,  # noqa: F401
    Match,  # noqa: F401
    Mismatch,  # noqa: F401
    Reduce,  # noqa: F401
    Report,
    Step,
    StepDone,  # noqa: F401
    StepFailed,  # noqa: F401
    StoreListening,  # noqa: F401
    Transfer,  # noqa: F401
    transfer_tag,  # noqa: F401
)
from simnpu.server.units.spawning import entry_point

_SPAWN = multiprocessing.get_context("spawn")
_ENGINE_MAIN = entry_point("simnpu.server.hccl.gloo_exchange_main:main")


class Engine:
    """One world's engine process on this host. `start` returns at once; what the process
    does comes to `on_report`, called from this engine's reader thread: `StoreListening`
    (first host only), `Formed`, then one `StepDone` or `StepFailed` per step, and last
    `EngineLost`. Steps may be submitted before the world has formed; they run after."""

    def __init__(self, setup: EngineSetup, on_report: Callable[[Report], None]):
        self.setup = setup
        self._on_report = on_report
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._send_lock = threading.Lock()

    def start(self) -> None:
        """Spawn the engine process. Does not wait for it to form the world."""
        ours, theirs = _SPAWN.Pipe()
        self._process = _SPAWN.Process(
            target=_ENGINE_MAIN,
            args=(theirs, self.setup),
            name="simnpu-engine",
            daemon=True,
        )
        self._process.start()
        theirs.close()
        self._conn = ours
        threading.Thread(target=self._read, name="simnpu-engine-reports", daemon=True).start()

    def submit(self, step: Step) -> None:
        """Hand the engine one step; never blocks on the exchange. A step submitted after
        the process has ended is dropped: its `EngineLost` has come or is coming."""
        assert self._conn is not None, "Engine.start first"
        with self._send_lock:
            try:
                self._conn.send(step)
            except OSError:
                pass

    def stop(self, graceful: bool = False, timeout_s: float = 5.0) -> None:
        """End the engine process and reap it; blocks until it has ended. `graceful`: after
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
        self._on_report(EngineLost(self._process.exitcode))
