"""Work the scheduler hands units before the streams' own: its dispatcher
(`Scheduler.dispatcher`).

HCCL's matched collectives are one (server/hccl/collectives.py): every rank of a collective
waits for its data movement, so it goes to idle AI cores before any stream's work. A
dispatcher has a deadline of its own too (HCCL_EXEC_TIMEOUT), which the scheduler's thread
wakes for. The control plane gives the scheduler its dispatcher (server/control/daemon.py);
a scheduler given none has `IDLE`, which never has work or a deadline.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Protocol


class Dispatcher(Protocol):
    """Ready work with a deadline, dispatched under the scheduler lock."""

    @property
    def jobs(self) -> Sized:
        """The work waiting to be handed out (empty: `dispatch` has nothing to do)."""

    @property
    def deadline(self) -> float | None:
        """When `expire` must run (time.monotonic()); None: nothing waits for one."""

    def dispatch(self) -> None:
        """Hand waiting work to idle units (Scheduler.hand, Scheduler.send); called before
        the streams' work is handed out, whenever `jobs` is not empty."""

    def expire(self, now: float) -> None:
        """Its deadline has passed at `now`: fail what waited too long."""


class _Idle:
    """The dispatcher of a scheduler given none."""

    jobs = ()
    deadline = None

    def dispatch(self) -> None:
        """(Never called: it has no jobs.)"""

    def expire(self, now: float) -> None:
        """(Never called: it has no deadline.)"""


IDLE: Dispatcher = _Idle()
