"""Rates a client cannot exceed, however fast it calls: a token bucket (`TokenBucket`), and
the daemon's log lines about one client (`ClientLog`): a burst, then a steady rate; the
rest are counted and reported in one later line (docs/client-bounds.md).

Not launches, copies or collectives: what a client asks the device to do is bounded by
its streams and its memory, not by a rate. Module loads have a bucket of their own
(server/control/module_loads.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from simnpu.server.core.untrusted import LOG_LINE, cut

LOG_BURST = 30
"""Lines about one client the daemon logs at once ..."""
LOG_RATE = 1.0
"""... and then a second, at most; the others are counted, not logged."""


class TokenBucket:
    """`rate` tokens a second, at most `burst` held; full at first. Not thread-safe: its
    user locks. `clock` is time.monotonic, or a fake one in tests."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or burst <= 0:
            raise ValueError("a token bucket needs a positive rate and burst")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def take(self, cost: float = 1.0) -> bool:
        """Take `cost` tokens if the bucket holds them; False (and nothing taken) if not."""
        self._refill()
        if self._tokens < cost:
            return False
        self._tokens -= cost
        return True

    def reserve(self, cost: float) -> float:
        """Take `cost` tokens now, into debt if need be: the seconds until the debt is paid
        (0: the bucket held them), which the caller waits before it goes on."""
        self._refill()
        self._tokens -= cost
        return max(0.0, -self._tokens / self.rate)

    def give_back(self, cost: float) -> None:
        """Undo a `reserve(cost)` the caller will not use after all."""
        self._refill()
        self._tokens = min(self.burst, self._tokens + cost)

    @property
    def full(self) -> bool:
        """True when the bucket holds its burst: a new bucket would be the same."""
        self._refill()
        return self._tokens >= self.burst


class ClientLog:
    """The daemon's log lines about one client (every session of one peer shares one:
    server/control/daemon.py): LOG_BURST of them at once, then LOG_RATE a second; the lines
    over that are counted, and the next line that passes is preceded by one saying how many
    were not logged. Each line is cut to LOG_LINE characters. Thread-safe."""

    def __init__(
        self,
        who: str,
        rate: float = LOG_RATE,
        burst: float = LOG_BURST,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.who = who
        self._bucket = TokenBucket(rate, burst, clock)
        self._lock = threading.Lock()
        self.dropped = 0  # lines not logged since the last one that was
        self.dropped_total = 0

    def log(
        self, logger: logging.Logger, level: int, msg: str, *args: object, exc_info: bool = False
    ) -> bool:
        """Log `msg % args` at `level` (with the traceback of the exception being handled if
        `exc_info`) if the client's rate allows; False if the line was only counted."""
        if not logger.isEnabledFor(level):
            return False
        with self._lock:
            if not self._bucket.take():
                self.dropped += 1
                self.dropped_total += 1
                return False
            dropped, self.dropped = self.dropped, 0
        if dropped:
            self._say_dropped(logger, dropped)
        text = msg % args if args else msg
        logger.log(level, "%s", cut(text, LOG_LINE), exc_info=exc_info)
        return True

    def info(self, logger: logging.Logger, msg: str, *args: object) -> bool:
        return self.log(logger, logging.INFO, msg, *args)

    def warning(self, logger: logging.Logger, msg: str, *args: object) -> bool:
        return self.log(logger, logging.WARNING, msg, *args)

    def exception(self, logger: logging.Logger, msg: str, *args: object) -> bool:
        """An ERROR line with the traceback of the exception being handled."""
        return self.log(logger, logging.ERROR, msg, *args, exc_info=True)

    def settle(self, logger: logging.Logger) -> None:
        """Say how many lines were not logged, if any (the daemon forgets this client)."""
        with self._lock:
            dropped, self.dropped = self.dropped, 0
        if dropped:
            self._say_dropped(logger, dropped)

    @property
    def rested(self) -> bool:
        """True when the client may log its whole burst again, as a new ClientLog could."""
        with self._lock:
            return self._bucket.full

    def _say_dropped(self, logger: logging.Logger, dropped: int) -> None:
        logger.warning(
            "%s: %d log line%s about it not logged (more than %d at once or %g a second)",
            self.who,
            dropped,
            "" if dropped == 1 else "s",
            int(self._bucket.burst),
            self._bucket.rate,
        )


def log_about(owner: object, logger: logging.Logger, level: int, msg: str, *args: object) -> None:
    """Log a line about `owner` through its ClientLog (`owner.lines`), or directly if it has
    none."""
    lines = getattr(owner, "lines", None)
    if isinstance(lines, ClientLog):
        lines.log(logger, level, msg, *args)
    else:
        logger.log(level, msg, *args)
