"""Rates a client cannot exceed (server/core/rate_limits.py) and the bounds of the strings
it sends (server/core/untrusted.py), on a fake clock."""

from __future__ import annotations

import logging

import pytest

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.core.rate_limits import ClientLog, TokenBucket, log_about
from simnpu.server.core.untrusted import LOG_LINE, check_length, cut, quoted


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def logger():
    logger = logging.getLogger("simnpu.test_rate_limits")
    handler = Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, handler.lines
    logger.removeHandler(handler)


# ---- the token bucket ----------------------------------------------------------------------------
def test_a_bucket_gives_its_burst_then_its_rate():
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=3.0, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5  # one token
    assert bucket.take() and not bucket.take()
    clock.now += 100  # never more than the burst
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]


def test_a_reservation_goes_into_debt_and_says_how_long_to_wait():
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=20.0, clock=clock)
    assert bucket.reserve(15) == 0.0
    assert bucket.reserve(15) == pytest.approx(1.0)  # 10 owed at 10 a second
    assert bucket.reserve(10) == pytest.approx(2.0)  # behind the first debt
    bucket.give_back(10)
    clock.now += 1.0
    assert bucket.reserve(0) == 0.0 and not bucket.full
    clock.now += 2.0
    assert bucket.full


def test_a_bucket_without_rate_or_burst_is_refused():
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1)


# ---- a client's log lines ------------------------------------------------------------------------
def test_a_client_logs_its_burst_then_its_rate_and_the_dropped_are_counted(logger):
    log, lines = logger
    clock = FakeClock()
    client = ClientLog("uid 1 pid 2", rate=1.0, burst=3, clock=clock)
    passed = [client.info(log, "line %d", n) for n in range(10)]
    assert passed == [True] * 3 + [False] * 7
    assert lines == ["line 0", "line 1", "line 2"]
    clock.now += 1.0
    assert client.warning(log, "line %d", 10)
    assert lines[3:] == [
        "uid 1 pid 2: 7 log lines about it not logged (more than 3 at once or 1 a second)",
        "line 10",
    ]
    assert client.dropped == 0 and client.dropped_total == 7


def test_settling_says_what_was_not_logged_once(logger):
    log, lines = logger
    clock = FakeClock()
    client = ClientLog("host x", rate=1.0, burst=1, clock=clock)
    client.info(log, "a")
    client.info(log, "b")
    assert not client.rested
    client.settle(log)
    client.settle(log)
    assert lines == [
        "a",
        "host x: 1 log line about it not logged (more than 1 at once or 1 a second)",
    ]
    clock.now += 1.0
    assert client.rested


def test_a_long_line_is_cut(logger):
    log, lines = logger
    ClientLog("c").info(log, "%s", "x" * (10 * LOG_LINE))
    assert len(lines[0]) == LOG_LINE and lines[0].endswith("\u2026")


def test_a_line_the_logger_would_not_log_costs_nothing(logger):
    log, lines = logger
    client = ClientLog("c", rate=1.0, burst=1, clock=FakeClock())
    for _ in range(5):
        client.log(log, logging.DEBUG, "quiet")
    assert client.info(log, "heard") and lines == ["heard"]


def test_an_exception_line_carries_its_traceback(logger):
    log, _ = logger
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log.addHandler(handler)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        ClientLog("c").exception(log, "failed")
    log.removeHandler(handler)
    assert records[0].exc_info is not None and records[0].levelno == logging.ERROR


def test_log_about_uses_the_owners_lines_or_logs_directly(logger):
    log, lines = logger

    class Owner:
        lines = ClientLog("o", rate=1.0, burst=1, clock=FakeClock())

    log_about(Owner(), log, logging.INFO, "one")
    log_about(Owner(), log, logging.INFO, "two")  # over its rate
    log_about(None, log, logging.INFO, "three")
    assert lines == ["one", "three"]


# ---- the bounds of client strings ----------------------------------------------------------------
def test_cut_keeps_short_text_and_ends_long_text_with_an_ellipsis():
    assert cut("short", 8) == "short"
    assert cut("x" * 9, 8) == "xxxxxxx\u2026"
    assert len(cut("y" * (16 << 20), 128)) == 128


def test_check_length_refuses_with_acl_error_invalid_param_quoting_only_the_start():
    assert check_length("k" * 10, 10, "the key") == "k" * 10
    with pytest.raises(NpuError) as raised:
        check_length("k" * (1 << 20), 10, "the key")
    assert raised.value.code == codes.ACL_ERROR_INVALID_PARAM == 100000
    assert "1,048,576 characters" in raised.value.message
    assert len(raised.value.message) < 300
    assert quoted("ab") == "'ab'"
