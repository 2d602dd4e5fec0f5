"""Gloo exchange processes (server/hccl/gloo_exchange.py, server/hccl/gloo_exchange_main.py):
real processes joined by Gloo over loopback, each over its own shared-memory segment, as the
hosts of a world."""

from __future__ import annotations

import os
import queue
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("torch", reason="the multihost extra (torch) is not installed")

from simnpu.proto import hccl_types as ht  # noqa: E402
from simnpu.server.hccl.gloo_exchange import ExchangeProcess
from simnpu.server.hccl.gloo_exchange_protocol import (  # noqa: E402
    Exchange,
    ExchangeLost,
    ExchangeSetup,
    Formed,
    Gather,
    Match,
    Mismatch,
    Reduce,
    Report,
    StepDone,
    StepFailed,
    StoreListening,
    Transfer,
    transfer_tag,
)
from simnpu.server.memory.device_backing import BackingLog  # noqa: E402
from simnpu.server.units import collective_pieces  # noqa: E402
from simnpu.shm.region import Region, segment_name  # noqa: E402

SEGMENT_BYTES = 4 << 20
BLOCK = 1 << 20  # the host block's offset in each segment
WAIT_S = 60.0  # far above any step here: a missing report fails the test, never hangs it


@dataclass
class Host:
    exchange: ExchangeProcess
    region: Region
    reports: queue.Queue

    def bytes(self) -> np.ndarray:
        return np.frombuffer(self.region.map, np.uint8, SEGMENT_BYTES)

    def block(self, dtype: str, count: int) -> np.ndarray:
        return self.bytes()[BLOCK:].view(collective_pieces.numpy_dtype(dtype))[:count]

    def next_report(self) -> Report:
        return self.reports.get(timeout=WAIT_S)


def form(hosts: int, timeout_s: float = WAIT_S, regions: list[Region] | None = None) -> list[Host]:
    """A world of `hosts` exchange processes on loopback, formed."""
    if regions is None:
        tag = secrets.token_hex(4)
        regions = [
            Region.create(segment_name("exchange-test", tag, h), SEGMENT_BYTES, device=True)
            for h in range(hosts)
        ]
    world: list[Host] = []
    port = 0
    for h in range(hosts):
        reports: queue.Queue = queue.Queue()
        setup = ExchangeSetup(
            h, hosts, "127.0.0.1", port, regions[h].name, timeout_s, WAIT_S, "127.0.0.1"
        )
        host = Host(ExchangeProcess(setup, reports.put, BackingLog()), regions[h], reports)
        host.exchange.start()
        world.append(host)
        if h == 0:
            listening = host.next_report()
            assert isinstance(listening, StoreListening) and listening.port > 0
            port = listening.port
    for host in world:
        assert isinstance(host.next_report(), Formed)
    return world


def finish(world: list[Host], close_regions: bool = True) -> None:
    for host in world:
        host.exchange.stop()
        if close_regions:
            host.region.close()


def run(world: list[Host], steps: list) -> None:
    """Submit steps[h] to host h, each a list, and expect every one to succeed."""
    for host, mine in zip(world, steps):
        for step in mine:
            host.exchange.submit(step)
    for host, mine in zip(world, steps):
        for step in mine:
            assert host.next_report() == StepDone(step.seq)


def even(count: int, itemsize: int, hosts: int) -> tuple:
    bounds = [count * h // hosts * itemsize for h in range(hosts + 1)]
    return tuple(((bounds[h], bounds[h + 1]),) for h in range(hosts))


def all_reduce(world: list[Host], dtype: str, data: list, first_seq: int) -> None:
    """Host h's block holds data[h]; a Reduce (sum) then a Gather over ranges cut evenly."""
    count = len(data[0])
    for host, values in zip(world, data):
        host.block(dtype, count)[:] = values
    owners = even(count, collective_pieces.numpy_dtype(dtype).itemsize, len(world))
    reduce = Reduce(first_seq, BLOCK, dtype, ht.HCCL_REDUCE_SUM, owners)
    run(world, [[reduce, Gather(first_seq + 1, BLOCK, owners)] for _ in world])


@pytest.fixture(scope="module")
def three() -> Iterator[list[Host]]:
    world = form(3)
    yield world
    finish(world)


def test_all_reduce_sums_each_element_in_host_order_on_every_host(three):
    count = 100_003  # not a multiple of 3 hosts
    rng = np.random.default_rng(1)
    data = [rng.standard_normal(count).astype(np.float32) * 10.0 ** (4 * h) for h in range(3)]
    all_reduce(three, "float32", data, 1)
    in_order = (data[0] + data[1]) + data[2]
    assert not np.array_equal(in_order, data[0] + (data[1] + data[2]))  # the order shows
    for host in three:
        assert host.block("float32", count).tobytes() == in_order.tobytes()


def test_reduce_over_scattered_ranges_leaves_the_rest_of_the_block_alone(three):
    count = 4096
    data = [np.arange(count, dtype=np.int32) * (1 if h != 1 else -1) + 7 * h for h in range(3)]
    for host, values in zip(three, data):
        host.block("int32", count)[:] = values
    slices = [(i * 512 * 4, (i + 1) * 512 * 4) for i in range(8)]  # 8 ranks' slices
    owners = (tuple(slices[0:2]) + (slices[5],), tuple(slices[2:5]), (slices[6], slices[7]))
    steps = [[Reduce(3, BLOCK, "int32", ht.HCCL_REDUCE_MAX, owners)] for _ in three]
    run(three, steps)
    expected_max = np.maximum(np.maximum(data[0], data[1]), data[2])
    for h, host in enumerate(three):
        got = host.block("int32", count)
        for first, end in slices:
            part = slice(first // 4, end // 4)
            want = expected_max if (first, end) in owners[h] else data[h]
            assert np.array_equal(got[part], want[part])


def test_bfloat16_sums_are_numpys_in_host_order(three):
    bf16 = collective_pieces.numpy_dtype("bfloat16")
    count = 3000
    rng = np.random.default_rng(2)
    data = [rng.standard_normal(count).astype(bf16) for _ in range(3)]
    all_reduce(three, "bfloat16", data, 4)
    expected = (data[0] + data[1]) + data[2]
    for host in three:
        assert host.block("bfloat16", count).tobytes() == expected.tobytes()


def test_a_gather_owned_by_one_host_broadcasts_and_uneven_ranges_gather(three):
    everything = (0, 64 << 10)
    for h, host in enumerate(three):
        host.bytes()[BLOCK : BLOCK + everything[1]] = h + 1
    root_owns = ((), (everything,), ())
    run(three, [[Gather(6, BLOCK, root_owns)] for _ in three])
    for host in three:
        assert (host.bytes()[BLOCK : BLOCK + everything[1]] == 2).all()
    uneven = (((0, 10),), ((10, 10),), ((10, 70_001),))  # host 1 owns nothing (an empty range)
    for h, host in enumerate(three):
        host.bytes()[BLOCK : BLOCK + 70_001] = 100 + h
    run(three, [[Gather(7, BLOCK, uneven)] for _ in three])
    for host in three:
        got = host.bytes()[BLOCK : BLOCK + 70_001]
        assert (got[:10] == 100).all() and (got[10:] == 102).all()


def test_an_exchange_moves_the_ranges_each_host_names_for_itself(three):
    """alltoall's exchange: host h sends peer p 100 * (p + 1) bytes of value 10 h + p, from
    its own place, into the receiver's place for h (each host lays out its block itself)."""
    sizes = [100 * (p + 1) for p in range(3)]
    for h, host in enumerate(three):
        data = host.bytes()
        for p in range(3):
            data[BLOCK + 1000 * p : BLOCK + 1000 * p + sizes[p]] = 10 * h + p
        data[BLOCK + 10_000 : BLOCK + 20_000] = 0
    steps = []
    for h in range(3):
        peers = [p for p in range(3) if p != h]
        sends = tuple((p, (1000 * p, 1000 * p + sizes[p])) for p in peers)
        recvs = tuple((p, (10_000 + 1000 * p, 10_000 + 1000 * p + sizes[h])) for p in peers)
        steps.append([Exchange(10, BLOCK, sends, recvs)])
    run(three, steps)
    for h, host in enumerate(three):
        data = host.bytes()
        for p in range(3):
            got = data[BLOCK + 10_000 + 1000 * p : BLOCK + 10_000 + 1000 * p + sizes[h] + 1]
            if p == h:
                assert not got.any()
            else:
                assert (got[:-1] == 10 * p + h).all() and got[-1] == 0, (h, p)
    del data


def transfer(seq, host, span, peer, source, destination, index, sending, count=None):
    """Rank `source`'s index-th send to rank `destination` (of 8), on either side."""
    tag = transfer_tag(source, destination, index, 8)
    match = f"{count if count is not None else span[1] - span[0]} uint8".encode()
    call = f"{'send' if sending else 'recv'} #{index}".encode()
    return Transfer(seq, host.region.name, span, peer, tag, sending, match, call)


def test_transfers_run_beside_each_other_in_any_order(three):
    """Two sends from host 0 to host 2; host 2 posts the second first, and a Gather runs
    between them: they still pair by tag, and each reports on its own."""
    sender, receiver = three[0], three[2]
    a, b = (BLOCK, BLOCK + 1000), (BLOCK + 1000, BLOCK + 3000)
    sender.bytes()[a[0] : a[1]] = 11
    sender.bytes()[b[0] : b[1]] = 22
    receiver.bytes()[BLOCK : BLOCK + 4000] = 0
    into_a, into_b = (BLOCK + 2000, BLOCK + 4000), (BLOCK, BLOCK + 1000)
    receiver.exchange.submit(transfer(21, receiver, into_a, 0, 0, 5, 1, sending=False))
    receiver.exchange.submit(transfer(22, receiver, into_b, 0, 0, 5, 0, sending=False))
    sender.exchange.submit(transfer(21, sender, a, 2, 0, 5, 0, sending=True))
    sender.exchange.submit(transfer(22, sender, b, 2, 0, 5, 1, sending=True))
    owners = tuple(((h, h + 1),) for h in range(3))
    for host in three:
        host.exchange.submit(Gather(23, BLOCK + 8000, owners))
    assert three[1].next_report() == StepDone(23)
    for host in (sender, receiver):
        reports = {host.next_report() for _ in range(3)}
        assert reports == {StepDone(21), StepDone(22), StepDone(23)}
    got = receiver.bytes()
    assert (got[BLOCK : BLOCK + 1000] == 11).all() and (
        got[BLOCK + 2000 : BLOCK + 4000] == 22
    ).all()
    del got


def test_a_killed_peer_fails_the_waiting_step_and_a_new_world_forms_after():
    world = form(2)
    try:
        span = (BLOCK, BLOCK + (1 << 20))
        world[0].exchange.submit(transfer(1, world[0], span, 1, 1, 0, 0, sending=False))
        pid = world[1].exchange.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        failed = world[0].next_report()  # long before the world's timeout (WAIT_S)
        assert isinstance(failed, StepFailed) and failed.seq == 1
        assert "closed" in failed.message.lower() or "reset" in failed.message.lower()
        assert isinstance(world[0].next_report(), ExchangeLost)
        lost = world[1].next_report()
        assert isinstance(lost, ExchangeLost) and lost.exitcode == -signal.SIGKILL
        again = form(2, regions=[host.region for host in world])
        try:
            count = 1000
            all_reduce(again, "int64", [np.arange(count) + h for h in range(2)], 1)
            for host in again:
                assert np.array_equal(host.block("int64", count), 2 * np.arange(count) + 1)
        finally:
            finish(again, close_regions=False)
    finally:
        finish(world)


def test_a_step_a_peer_never_answers_fails_after_the_worlds_timeout_naming_it():
    world = form(2, timeout_s=2.0)
    try:
        run(world, [[Match(1, b"barrier()")] for _ in world])
        world[0].exchange.submit(Match(2, b"barrier()"))  # host 1 never comes
        failed = world[0].next_report()
        assert isinstance(failed, StepFailed) and failed.seq == 2, failed
        assert "timed out" in failed.message.lower() or "timeout" in failed.message.lower()
        assert failed.silent == (1,)
        assert isinstance(world[0].next_report(), ExchangeLost)
    finally:
        finish(world)


def test_stop_ends_the_process_and_a_missing_segment_is_reported():
    reports: queue.Queue = queue.Queue()
    setup = ExchangeSetup(0, 1, "127.0.0.1", 0, "/simnpu-no-such-segment", WAIT_S, WAIT_S)
    exchange = ExchangeProcess(setup, reports.put, BackingLog())
    exchange.start()
    failed = reports.get(timeout=WAIT_S)
    assert isinstance(failed, StepFailed) and failed.seq == -1
    assert "/simnpu-no-such-segment" in failed.message
    assert isinstance(reports.get(timeout=WAIT_S), ExchangeLost)
    exchange.stop()
    world = form(1)
    pid = world[0].exchange.pid
    finish(world)
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_match_compares_every_hosts_call_and_a_mismatch_ends_the_exchange_process():
    world = form(2)
    try:
        run(world, [[Match(1, b"all_reduce(count=4, fp32, sum)")] for _ in world])
        world[0].exchange.submit(Match(2, b"all_reduce(count=4, fp32, sum)"))
        world[1].exchange.submit(Match(2, b"all_reduce(count=4, fp32, max)"))
        calls = (b"all_reduce(count=4, fp32, sum)", b"all_reduce(count=4, fp32, max)")
        for host in world:
            assert host.next_report() == Mismatch(2, calls)
            assert isinstance(host.next_report(), ExchangeLost)
    finally:
        finish(world)


def test_a_transfer_whose_sides_differ_is_a_mismatch_at_the_receiver():
    world = form(2)
    try:
        sender, receiver = world
        span = (BLOCK, BLOCK + 64)
        sender.exchange.submit(transfer(1, sender, span, 1, 0, 1, 0, sending=True, count=16))
        receiver.exchange.submit(transfer(1, receiver, span, 0, 0, 1, 0, sending=False, count=8))
        assert receiver.next_report() == Mismatch(1, (b"send #0", b"recv #0"))
        assert isinstance(receiver.next_report(), ExchangeLost)
    finally:
        finish(world)


def test_gloo_listens_on_the_interface_of_the_advertised_address():
    from simnpu.server.hccl.gloo_exchange_main import interface_of

    assert interface_of("127.0.0.1") == "lo"
    if os.path.exists("/proc/net/if_inet6"):  # IPv6 on this machine
        assert interface_of("::1") == "lo"
    assert interface_of("2001:db8::1") is None  # documentation prefix: on no interface
    assert interface_of("192.0.2.1") is None  # TEST-NET-1: on no interface here
    assert interface_of("no-such-host.invalid") is None
