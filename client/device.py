"""The process's runtime, and Device: a simulated NPU bound to the calling thread."""

from __future__ import annotations

import threading

from simnpu.client.runtime import Runtime
from simnpu.proto import codes

_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """This process's Runtime, connecting (and starting the daemon if needed) on first use."""
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = Runtime()
    return _runtime


def connect(address: str | None = None, token: str | None = None) -> Runtime:
    """Connect this process to the daemon at `address` (default: SIMNPU_ADDRESS or the
    per-user socket). Blocks. Replaces nothing: call shutdown() first to switch daemons."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime(address, token)
    return _runtime


def shutdown() -> None:
    """End this process's session; the daemon frees everything it still owned."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
            _runtime = None


def device_count() -> int:
    """aclrtGetDeviceCount."""
    return runtime().get_device_count()


class Device:
    """Mirrors aclrtSetDevice: binds device `index` to this thread (its default context
    becomes current). `with Device(0):` releases it again (aclrtResetDevice) on exit,
    waiting for the device's work; a KeyboardInterrupt (Ctrl-C) leaving the block drops
    the work not started yet instead, as the end of the program would."""

    def __init__(self, index: int = 0):
        self.index = index
        runtime().set_device(index)
        self._released = False

    def __repr__(self) -> str:
        return f"<simnpu Device {self.index}>"

    def __enter__(self) -> Device:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_) -> None:
        self.reset(drop_queued=kind is not None and issubclass(kind, KeyboardInterrupt))

    def reset(self, drop_queued: bool = False) -> None:
        """aclrtResetDevice: the last reference waits for the device's work and frees its
        default context. Blocks. Idempotent. `drop_queued`: discard the tasks not started
        yet instead of waiting for them (tasks already running finish)."""
        if not self._released:
            self._released = True
            runtime().reset_device(self.index, drop_queued)

    @property
    def default_stream(self):
        from simnpu.client.stream import Stream

        return Stream.wrap(0)

    def synchronize(self, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeDevice: wait for all of this process's work on the device. Blocks."""
        runtime().synchronize_device(timeout_ms)

    def mem_info(self) -> tuple[int, int]:
        """aclrtGetMemInfo: (free, total) bytes."""
        return runtime().get_mem_info(codes.ACL_HBM_MEM)

    def memory_stats(self) -> dict:
        """The pool's statistics under torch.cuda.memory_stats key names (docs/memory.md).
        Blocks."""
        return runtime().memory_stats(self.index)

    def memory_snapshot(self) -> list[dict]:
        """The device's live blocks in address order: address, size, reserved, huge, owner
        ("session N (pid P name)"), session, pid, and IPC sharing. Blocks."""
        return runtime().memory_snapshot(self.index)

    def set_memory_limit(self, nbytes: int) -> None:
        """Lower this process's memory limit on the device (0: back to the daemon's default).
        Blocks."""
        runtime().set_memory_limit(nbytes, self.index)

    @property
    def memory_limit(self) -> int | None:
        """This process's memory limit on the device in bytes (None: the whole device)."""
        return runtime().memory_limit(self.index)[0]
