"""The process's runtime, and Device: a simulated NPU bound to the calling thread."""

from __future__ import annotations

import threading

from simnpu.client.runtime import Runtime
from simnpu.client.transport import call_site
from simnpu.proto import codes

_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """This process's session with the daemon: the raw layer (client/runtime/) that every
    other call stands on, one method per ACL call on its parts (`runtime().memory.malloc`,
    `runtime().sync.synchronize_stream`, ...). No ACL call. Blocks on first use, which
    connects as connect() does; Local afterwards."""
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = Runtime()
    return _runtime


def connect(address: str | None = None, token: str | None = None) -> Runtime:
    """Connect this process to the daemon at `address` (default: SIMNPU_ADDRESS, else the
    per-user socket). At the per-user socket a daemon is started when none answers (unless
    SIMNPU_AUTOSTART=0); at a named address only with SIMNPU_AUTOSTART=1; otherwise
    NpuError 207004. `token` is for a TCP daemon that wants one (default:
    SIMNPU_TOKEN / SIMNPU_TOKEN_FILE). The session aclInit opens for `acl`; `acl` and this
    API share it. No ACL call of its own. Blocks. Replaces nothing: an existing session is
    returned whatever `address` says; call shutdown() first to switch daemons."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = Runtime(address, token)
    return _runtime


def shutdown() -> None:
    """End this process's session (what aclFinalize does for `acl`): the daemon frees
    everything the process still owned. A later call connects again (to the default
    address). Blocks; a no-op when not connected."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
            _runtime = None


def device_count() -> int:
    """aclrtGetDeviceCount: the number of simulated devices (ids 0 .. count-1). Local once
    connected (the count comes with the session); connects first if needed."""
    return runtime().contexts.get_device_count()


class Device:
    """Mirrors aclrtSetDevice: binds device `index` to this thread (its default context
    becomes current; later streams, events and buffers belong to it). `with Device(0):`
    releases it again (aclrtResetDevice) on exit, waiting for the device's work; a
    KeyboardInterrupt (Ctrl-C) leaving the block drops the work not started yet instead, as
    the end of the program would. Blocks when the process holds no reference to `index` yet
    (that creates the default context), Local otherwise; an index out of range raises
    NpuError 107001."""

    def __init__(self, index: int = 0):
        self.index = index
        runtime().contexts.set_device(index, site=call_site())
        self._released = False

    def __repr__(self) -> str:
        return f"<simnpu Device {self.index}>"

    def __enter__(self) -> Device:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_) -> None:
        self.reset(drop_queued=kind is not None and issubclass(kind, KeyboardInterrupt))

    def reset(self, drop_queued: bool = False) -> None:
        """aclrtResetDevice: drops this object's reference; the process's last reference
        waits for the device's work and frees its default context with its streams. Blocks.
        Idempotent. `drop_queued`: the last reference discards the tasks not started yet
        instead of waiting for them (tasks already running finish)."""
        if not self._released:
            self._released = True
            runtime().contexts.reset_device(self.index, drop_queued, site=call_site())

    @property
    def default_stream(self):
        """The default stream of this thread's current context (stream handle 0, the one
        aclrtSetDevice made): this device's while it is the one set last. Local."""
        from simnpu.client.stream import Stream

        return Stream.wrap(0)

    def synchronize(self, timeout_ms: int = -1) -> None:
        """aclrtSynchronizeDevice(WithTimeout): wait for all of this process's work on the
        device of this thread's current context (the one set last) and raise its first
        failure. Blocks; `timeout_ms` -1 waits forever."""
        runtime().sync.synchronize_device(timeout_ms)

    def mem_info(self) -> tuple[int, int]:
        """aclrtGetMemInfo(ACL_HBM_MEM): (free, total) bytes of the current context's device;
        under a memory limit, total is the limit and free what is left of it. Blocks."""
        return runtime().memory.get_mem_info(codes.ACL_HBM_MEM, site=call_site())

    def memory_stats(self) -> dict:
        """The device pool's statistics under torch.cuda.memory_stats key names
        (docs/memory.md). No ACL call. Blocks."""
        return runtime().memory.memory_stats(self.index, site=call_site())

    def memory_snapshot(self) -> list[dict]:
        """The device's live blocks in address order: address, size, reserved, huge, owner
        ("session N (pid P name)"), session, pid, and IPC sharing. No ACL call. Blocks."""
        return runtime().memory.memory_snapshot(self.index, site=call_site())

    def set_memory_limit(self, nbytes: int) -> None:
        """Lower this process's memory limit on the device to `nbytes` (0: back to the
        daemon's default; above that default: NpuError 107000). SIMNPU_MEMORY_LIMIT sets it
        at connection. No ACL call. Blocks."""
        runtime().memory.set_memory_limit(nbytes, self.index, site=call_site())

    @property
    def memory_limit(self) -> int | None:
        """This process's memory limit on the device in bytes (None: the whole device).
        No ACL call. Blocks."""
        return runtime().memory.memory_limit(self.index, site=call_site())[0]
