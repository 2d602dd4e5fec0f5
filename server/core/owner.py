"""The client that owns contexts, streams and tasks, as the scheduler and the tasks see it,
and the device output its kernels printed that no synchronize has taken yet.

Its session creates it and keeps it up to date; the scheduler changes what it keeps for the
client (its pending output, its rejected call) under the scheduler lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from simnpu.server.core.rate_limits import ClientLog
from simnpu.server.core.unit_protocol import INCOMPLETE, MAX_OUTPUT
from simnpu.server.core.untrusted import escaped

if TYPE_CHECKING:
    from simnpu.server.core.streams import Context, Failure, Stream
    from simnpu.server.core.tasks.host_callback import HostCallbackTask
    from simnpu.shm.notify import NotifyArea

PENDING_SPACE = 1 << 20
"""Characters the daemon keeps for one client until a synchronize takes them."""


class Owner:
    """The client process that owns contexts, streams and tasks, as the scheduler and the
    tasks see it (its session keeps it up to date): who it is, its operator timeout, the
    rejected call it has not been told about, its completion signals, and where its host
    callbacks are announced."""

    def __init__(self, session_id: int, announce: Callable[[int], None]):
        self.id = session_id
        self.pid = 0
        self.process_name = "?"  # cut to untrusted.PROCESS_NAME characters
        # the daemon's log lines about the client, rate limited; every session of one peer
        # shares one (server/control/daemon.py, open_session)
        self.lines = ClientLog(f"session {session_id}")
        self.announce = announce  # (callback id): tell the client to run a host callback now
        self.op_timeout_s: float | None = None  # aclrtSetOpExecuteTimeOut; None: the daemon's
        self.rejected: Failure | None = (
            None  # a rejected asynchronous call, reported at the next sync
        )
        self.contexts: list[Context] = []
        self.signals: NotifyArea | None = (
            None  # its notify area, with the streams' signals (fast path)
        )
        self.waiting_callbacks: dict[int, HostCallbackTask] = {}  # blocking host callbacks by id
        self.closed = False
        self.memory_generation = 0  # changes whenever the device memory it may use does
        # what its kernel processes map (server/units/kernel_processes.py): () -> a grant
        self.kernel_grant: Callable[[], object] | None = None
        # aclrtSetDeviceResLimit: device -> {aclrtDevResLimitType: cores}, as set; and
        # device -> the AI cores its work may run on (the smaller of the two), which the
        # scheduler reads; a device not listed has no limit
        self.res_limits: dict[int, dict[int, int]] = {}
        self.core_limits: dict[int, int] = {}
        # device -> the number of the scheduler's latest hand-out of an AI core of the
        # device to it: the clients with ready work take the free cores in turn by it
        # (server/core/scheduler.py, pick_client); a device not listed never served it
        self.core_turns: dict[int, int] = {}
        self.output = PendingOutput()  # what its kernels printed, for its next synchronize
        # aclrtSetDeviceSatMode: True once it chose ACL_RT_OVERFLOW_MODE_SATURATION; each
        # stream takes the mode in force when it is created (Stream.saturation)
        self.saturation = False

    def __repr__(self) -> str:
        return f"session {self.id} (pid {self.pid} {escaped(self.process_name)})"

    def streams(self) -> list[Stream]:
        return [stream for context in self.contexts for stream in context.streams]


class PendingOutput:
    """A client's device output that no synchronize has taken yet (server/units/device_printf.py
    formats it; under the scheduler lock): pieces kept in task order, about MAX_OUTPUT
    characters per task and PENDING_SPACE in all. `pending` says whether there is any: a
    plain attribute, read whenever one of the client's streams drains."""

    __slots__ = ("_dropped", "_pieces", "_size", "_tasks", "pending")

    def __init__(self) -> None:
        self._pieces: list[tuple[int, int, str]] = []  # (task seq, token, text)
        self._tasks: dict[int, int] = {}  # task seq -> characters kept of its pieces
        self._size = 0
        self._dropped = 0
        self.pending = False  # something was kept or dropped since the last take()

    def add(self, seq: int, token: int, text: str) -> None:
        """A piece's output (`token`: pieces of one task are handed out in block order).
        A task's pieces together keep MAX_OUTPUT characters: the piece that crosses it is cut
        and says so. Text that is not valid Unicode (a lone surrogate) gets "?" instead."""
        text = text.encode("utf-8", "replace").decode("utf-8")
        used = self._tasks.get(seq, 0)
        if used >= MAX_OUTPUT:
            return
        if used + len(text) > MAX_OUTPUT:
            text = text[: MAX_OUTPUT - used] + "\n" + INCOMPLETE
        self._tasks[seq] = used + len(text)
        self.pending = True
        if self._size + len(text) > PENDING_SPACE:
            self._dropped += len(text)
            return
        self._size += len(text)
        self._pieces.append((seq, token, text))

    def take(self) -> str:
        """Everything kept, in task order (then block order), and what was dropped."""
        if not self.pending:
            return ""
        self._pieces.sort()
        text = "".join(piece for _, _, piece in self._pieces)
        if self._dropped:
            text += (
                f"[simnpu] {self._dropped} characters of device output were dropped: more than "
                f"{PENDING_SPACE} waited for a synchronize\n"
            )
        self._pieces, self._size, self._dropped = [], 0, 0
        self._tasks.clear()
        self.pending = False
        return text
