"""Starting and supervising worker processes (the daemon's side of simnpu.server.worker).

A WorkerHandle is one AI core or copy engine: its process, its pipe, and what the
scheduler has handed it. Only the scheduler thread touches a handle after start().
"""

from __future__ import annotations

import multiprocessing
import time

from simnpu.server import worker

_SPAWN = multiprocessing.get_context("spawn")

AI_CORE = "AI core"
COPY_ENGINE = "copy engine"


class WorkerHandle:
    """One worker process; restartable after it dies."""

    def __init__(self, kind: str, device: int, index: int, core_id: int, region_names: list[str]):
        self.kind = kind
        self.device = device
        self.index = index
        self.core_id = core_id
        self.region_names = region_names
        self.process = None
        self.conn = None
        self.ready = False
        self.inflight: dict[int, object] = {}  # token -> task of the batch being executed
        self.deadline: float | None = None
        self.loaded: set[int] = set()  # binary ids whose module this process has exec'd
        self.busy_ns = 0  # total time spent executing, for utilisation
        self.forget: list[str] = []  # unlinked segments to unmap, sent with the next batch
        self.notify_seq = None  # (stream, seq) whose word this worker writes after its batch
        self.restarts = 0

    @property
    def name(self) -> str:
        return f"device {self.device} {self.kind} {self.index}"

    @property
    def idle(self) -> bool:
        return self.ready and not self.inflight

    def start(self) -> None:
        """Spawn the process; it is usable once its ("ready",) message arrives."""
        parent, child = _SPAWN.Pipe()
        self.process = _SPAWN.Process(
            target=worker.main, args=(self.core_id, self.region_names, child),
            name=f"simnpu-{self.kind.replace(' ', '-')}-{self.device}.{self.index}", daemon=True)
        self.process.start()
        child.close()
        self.conn = parent
        self.ready = False
        self.inflight = {}
        self.deadline = None
        self.notify_seq = None
        self.loaded = set()
        self.forget = []

    def send(self, batch: list) -> None:
        if self.forget:
            batch = [("forget", name) for name in self.forget] + batch
            self.forget = []
        self.conn.send(batch)

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the process to exit; kill it if it does not. Idempotent."""
        if self.process is None:
            return
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)
        self.conn.close()
        self.process = None

    def kill(self) -> None:
        """Kill at once (timeout, or the process is stuck); the caller restarts it."""
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        if self.conn is not None:
            self.conn.close()

    def exit_description(self) -> str:
        code = self.process.exitcode if self.process is not None else None
        if code is None:
            return "stopped responding"
        return f"died with signal {-code}" if code < 0 else f"exited with code {code}"


def wait_ready(handles: list[WorkerHandle], timeout: float = 60.0) -> None:
    """Block until every handle's process has sent ("ready",); used once at daemon start."""
    deadline = time.monotonic() + timeout
    for handle in handles:
        remaining = deadline - time.monotonic()
        if not handle.conn.poll(max(remaining, 0)):
            raise RuntimeError(f"{handle.name} did not start within {timeout:.0f} s")
        message = handle.conn.recv()
        if message != ("ready",):
            raise RuntimeError(f"{handle.name} sent {message!r} instead of ready")
        handle.ready = True
