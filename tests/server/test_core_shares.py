"""core_share (server/core/core_shares.py): each client active on a device may hold at most
ceil(cores / active clients) of its AI cores; a client alone gets them all."""

from __future__ import annotations

from types import SimpleNamespace

from simnpu.server.core.core_shares import core_share
from simnpu.server.core.executor import Unit, UnitKind
from simnpu.server.core.owner import Owner

WINDOW_S = 0.05


def cores(count: int) -> list[Unit]:
    return [Unit(UnitKind.AI_CORE, 0, i, i) for i in range(count)]


def running(unit: Unit, owner: Owner) -> None:
    unit.inflight[1] = SimpleNamespace(stream=SimpleNamespace(owner=owner))


def ready(*owners: Owner) -> list:
    return [SimpleNamespace(owner=owner) for owner in owners]


def client(number: int) -> Owner:
    return Owner(number, lambda callback: None)


def test_a_client_alone_gets_every_core():
    flooder = client(1)
    units = cores(2)
    running(units[0], flooder)
    share, lapses = core_share(units, ready(flooder, flooder), {flooder: 10.0}, 10.0, WINDOW_S)
    assert share is None and lapses is None


def test_a_client_that_just_ran_keeps_a_core_free():
    flooder, victim = client(1), client(2)
    units = cores(2)
    running(units[0], flooder)
    seen = {flooder: 10.0, victim: 9.99}
    share, lapses = core_share(units, ready(flooder), seen, 10.0, WINDOW_S)
    assert share is not None and share.cap == 1
    assert not share.may_take(flooder), "it holds its share"
    assert share.may_take(victim)
    assert lapses == 9.99 + WINDOW_S, "when the kept core may go to the flooder"


def test_a_client_stops_counting_after_the_window_or_when_it_closed():
    flooder, idle, closed = client(1), client(2), client(3)
    closed.closed = True
    units = cores(2)
    running(units[0], flooder)
    seen = {flooder: 10.0, idle: 9.9, closed: 10.0}
    share, lapses = core_share(units, ready(flooder), seen, 10.0, WINDOW_S)
    assert share is None and lapses is None
    assert seen == {flooder: 10.0}, "the others are forgotten"


def test_shares_are_counted_as_cores_are_handed_out():
    first, second, third = client(1), client(2), client(3)
    units = cores(4)
    share, _ = core_share(units, ready(first, second, third), {}, 10.0, WINDOW_S)
    assert share is not None and share.cap == 2  # ceil(4 / 3)
    share.took(first)
    assert share.may_take(first)
    share.took(first)
    assert not share.may_take(first) and share.may_take(second)
