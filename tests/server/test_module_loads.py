"""Module loads (server/control/module_loads.py): the fair queue of parses on plain
tickets, and each client's rate on a fake clock."""

from __future__ import annotations

import threading

import pytest

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.control.module_loads import (
    LOAD_OVERHEAD,
    MAX_LOAD_WAIT_S,
    FairQueue,
    ModuleLoads,
    Ticket,
)

BIG, TINY = 1 << 20, 200


def ticket(client: str, size: int = BIG) -> Ticket:
    return Ticket(client, size, size <= 64 << 10)


# ---- the fair queue ------------------------------------------------------------------------------
def test_clients_are_served_in_turn_one_parse_each():
    queue = FairQueue(slots=1)
    a = [ticket("a") for _ in range(3)]
    b = [ticket("b") for _ in range(2)]
    for t in a + b:  # a queued all of its loads before b queued any
        queue.add(t)
    order = []
    while True:
        started = queue.start()
        if not started:
            break
        assert len(started) == 1  # one slot for large modules
        order.append(started[0].client)
        queue.done(started[0])
    assert order == ["a", "b", "a", "b", "a"]


def test_a_client_never_has_two_parses_at_once():
    queue = FairQueue(slots=4)
    first, second = ticket("a"), ticket("a")
    queue.add(first)
    queue.add(second)
    assert queue.start() == [first]
    assert queue.start() == []
    queue.done(first)
    assert queue.start() == [second]


def test_a_small_module_does_not_wait_for_large_parses():
    queue = FairQueue(slots=2)
    floods = [ticket(f"flood{n}") for n in range(4)]
    for t in floods:
        queue.add(t)
    assert queue.start() == floods[:2]  # every slot for large modules is taken
    victim = ticket("victim", TINY)
    queue.add(victim)
    assert queue.start() == [victim]  # the small modules' slot
    other = ticket("other", TINY)
    queue.add(other)
    assert queue.start() == []  # ... which is one slot
    queue.done(victim)
    assert queue.start() == [other]
    queue.done(floods[0])
    assert queue.start() == [floods[2]]
    assert queue.running == 3 and queue.waiting == 1


def test_a_newcomer_is_served_before_a_client_that_was_just_served():
    queue = FairQueue(slots=1)
    a1, a2 = ticket("a"), ticket("a")
    queue.add(a1)
    queue.add(a2)
    assert queue.start() == [a1]
    b = ticket("b")
    queue.add(b)  # while a's first parse runs
    queue.done(a1)
    assert queue.start() == [b]


# ---- each client's rate --------------------------------------------------------------------------
class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def loads(time: FakeTime, max_module: int = BIG) -> ModuleLoads:
    return ModuleLoads(max_module, parsers=2, clock=time.clock, sleep=time.sleep)


def test_a_client_loads_its_burst_at_once_then_waits_for_its_rate():
    time = FakeTime()
    modules = loads(time)
    assert modules.burst == 2 * BIG + 2 * LOAD_OVERHEAD and modules.rate == BIG / 4
    for _ in range(2):  # two of the largest modules at once
        assert modules.load("a", BIG, lambda: "parsed") == "parsed"
    assert time.slept == []
    modules.load("a", BIG, lambda: None)
    assert time.slept == [pytest.approx((BIG + LOAD_OVERHEAD) / modules.rate)]
    modules.load("b", BIG, lambda: None)  # another client has its own rate
    assert len(time.slept) == 1
    assert modules.describe() == {
        "parsing": 0,
        "waiting": 0,
        "loads": 4,
        "rate_waited": 1,
        "rate_refused": 0,
    }


def test_small_loads_are_counted_by_their_number_too():
    time = FakeTime()
    modules = loads(time)
    at_once = int(modules.burst // (TINY + LOAD_OVERHEAD))
    for _ in range(at_once):
        modules.load("a", TINY, lambda: None)
    assert time.slept == []
    modules.load("a", TINY, lambda: None)
    assert len(time.slept) == 1


def test_a_load_that_would_wait_too_long_is_refused_and_costs_nothing():
    time = FakeTime()
    modules = loads(time)
    modules.max_wait_s = 5.0
    modules.load("a", BIG, lambda: None)
    modules.load("a", BIG, lambda: None)
    sleeps = []
    modules._sleep = sleeps.append  # the wait is not served: the debt stays
    modules.load("a", BIG, lambda: None)  # about 4 s
    with pytest.raises(NpuError) as raised:
        modules.load("a", BIG, lambda: None)  # about 8 s
    assert raised.value.code == codes.ACL_ERROR_RT_OVER_LIMIT
    assert "load it later" in raised.value.message
    assert modules.describe()["rate_refused"] == 1
    time.now += sleeps[0]  # the refused load cost nothing: the next waits only its own
    modules._sleep = time.sleep
    modules.load("a", BIG, lambda: None)
    assert time.slept[-1] < 5.0
    assert MAX_LOAD_WAIT_S >= 4 * (BIG + LOAD_OVERHEAD) / modules.rate  # 16 s of default


def test_a_failed_parse_gives_its_slot_back():
    modules = loads(FakeTime())

    def fails():
        raise NpuError(codes.ACL_ERROR_INVALID_FILE, "bad")

    with pytest.raises(NpuError):
        modules.load("a", TINY, fails)
    assert modules.describe()["parsing"] == 0
    assert modules.load("a", TINY, lambda: 1) == 1


def test_threads_wait_for_their_turn():
    """Real threads: the victim's small load starts while two large parses hold every
    large slot, and the clients' third large load waits until one of them ends."""
    modules = ModuleLoads(BIG, parsers=2)
    release = threading.Event()
    started: list[str] = []
    lock = threading.Lock()

    def parse(name: str):
        with lock:
            started.append(name)
        if name.startswith("flood"):
            release.wait(10)
        return name

    threads = [
        threading.Thread(
            target=modules.load, args=(f"flood{n}", BIG, lambda n=n: parse(f"flood{n}"))
        )
        for n in range(3)
    ]
    for thread in threads:
        thread.start()
    for _ in range(200):
        if modules.describe()["parsing"] == 2 and modules.describe()["waiting"] == 1:
            break
        threading.Event().wait(0.01)
    assert modules.load("victim", TINY, lambda: parse("victim")) == "victim"
    assert len(started) == 3 and started[-1] == "victim"  # the third flood still waits
    release.set()
    for thread in threads:
        thread.join(10)
    assert len(started) == 4 and modules.describe()["loads"] == 4


def test_a_client_between_two_loads_is_not_a_newcomer():
    """A flooder's next load comes after its last one ended: it still waits behind a client
    that was never served."""
    queue = FairQueue(slots=1)
    first = ticket("flood")
    queue.add(first)
    assert queue.start() == [first]
    victim = ticket("victim")
    queue.add(victim)
    queue.done(first)
    again = ticket("flood")
    queue.add(again)  # before the queue starts anyone
    assert queue.start() == [victim]
