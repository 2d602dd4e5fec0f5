"""Waiters: the host calls that block until work completes (synchronize, destroy), which the
scheduler re-checks as tasks complete and settles once (Scheduler.watch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn


@dataclass(eq=False)
class Waiter:
    """A blocked host call (synchronize, destroy): `ready()` is re-checked as work completes;
    `finish(timed_out)` answers it once."""

    ready: Callable[[], bool]
    finish: Callable[[bool], None]
    deadline: float | None = None
    finished: bool = False

    def settle(self, timed_out: bool = False) -> None:
        if not self.finished:
            self.finished = True
            finish = self.finish
            # settled, it holds nothing: it may stay among the scheduler's timers until its
            # deadline, and what it would call holds its whole session
            self.ready = self.finish = _settled
            finish(timed_out)


def _settled(*_: object) -> NoReturn:
    """What a settled waiter holds in place of its callables (they are not called again)."""
    raise AssertionError("a settled waiter was used again")
