"""Engine processes (server/engine.py, server/engine_main.py): real processes joined by
Gloo over loopback, each over its own shared-memory segment, as the hosts of a world."""

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
from simnpu.server import reduce  # noqa: E402
from simnpu.server.engine import (  # noqa: E402
    Engine,
    EngineLost,
    EngineSetup,
    Formed,
    Gather,
    Match,
    Mismatch,
    Recv,
    Reduce,
    Report,
    Send,
    StepDone,
    StepFailed,
    StoreListening,
)
from simnpu.shm.region import Region, segment_name  # noqa: E402

SEGMENT_BYTES = 4 << 20
BLOCK = 1 << 20  # the host block's offset in each segment
WAIT_S = 60.0  # far above any step here: a missing report fails the test, never hangs it


@dataclass
class Host:
    engine: Engine
    region: Region
    reports: queue.Queue

    def bytes(self) -> np.ndarray:
        return np.frombuffer(self.region.map, np.uint8, SEGMENT_BYTES)

    def block(self, dtype: str, count: int) -> np.ndarray:
        return self.bytes()[BLOCK:].view(reduce.numpy_dtype(dtype))[:count]

    def next_report(self) -> Report:
        return self.reports.get(timeout=WAIT_S)


def form(hosts: int, timeout_s: float = WAIT_S, regions: list[Region] | None = None) -> list[Host]:
    """A world of `hosts` engine processes on loopback, formed."""
    if regions is None:
        tag = secrets.token_hex(4)
        regions = [
            Region.create(segment_name("engine-test", tag, h), SEGMENT_BYTES, device=True)
            for h in range(hosts)
        ]
    world: list[Host] = []
    port = 0
    for h in range(hosts):
        reports: queue.Queue = queue.Queue()
        setup = EngineSetup(
            h, hosts, "127.0.0.1", port, regions[h].name, timeout_s, WAIT_S, "127.0.0.1"
        )
        host = Host(Engine(setup, reports.put), regions[h], reports)
        host.engine.start()
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
        host.engine.stop()
        if close_regions:
            host.region.close()


def run(world: list[Host], steps: list) -> None:
    """Submit steps[h] to host h, each a list, and expect every one to succeed."""
    for host, mine in zip(world, steps):
        for step in mine:
            host.engine.submit(step)
    for host, mine in zip(world, steps):
        for step in mine:
            assert host.next_report() == StepDone(step.seq)


def even(count: int, itemsize: int, hosts: int) -> tuple:
    bounds = [count * h // hosts * itemsize for h in range(hosts + 1)]
    return tuple(((bounds[h], bounds[h + 1]),) for h in range(hosts))


@pytest.fixture(scope="module")
def three() -> Iterator[list[Host]]:
    world = form(3)
    yield world
    finish(world)


def test_all_reduce_sums_each_element_in_host_order_on_every_host(three):
    count = 100_003  # not a multiple of 3 hosts
    rng = np.random.default_rng(1)
    data = [rng.standard_normal(count).astype(np.float32) * 10.0 ** (4 * h) for h in range(3)]
    for host, values in zip(three, data):
        host.block("float32", count)[:] = values
    owners = even(count, 4, 3)
    run(
        three,
        [
            [Reduce(1, BLOCK, "float32", ht.HCCL_REDUCE_SUM, owners), Gather(2, BLOCK, owners)]
            for _ in three
        ],
    )
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
    bf16 = reduce.numpy_dtype("bfloat16")
    count = 3000
    rng = np.random.default_rng(2)
    data = [rng.standard_normal(count).astype(bf16) for _ in range(3)]
    for host, values in zip(three, data):
        host.block("bfloat16", count)[:] = values
    owners = even(count, 2, 3)
    run(
        three,
        [
            [Reduce(4, BLOCK, "bfloat16", ht.HCCL_REDUCE_SUM, owners), Gather(5, BLOCK, owners)]
            for _ in three
        ],
    )
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


def test_send_and_recv_move_ranges_between_two_hosts_in_order(three):
    sender, receiver = three[0].bytes(), three[2].bytes()
    sender[BLOCK : BLOCK + 1000] = 11
    sender[BLOCK + 1000 : BLOCK + 2000] = 22
    receiver[BLOCK : BLOCK + 2000] = 0
    steps = [
        [Send(8, BLOCK, (1000, 2000), 2, tag=5), Send(9, BLOCK, (0, 1000), 2, tag=6)],
        [],
        [Recv(8, BLOCK, (0, 1000), 0, tag=5), Recv(9, BLOCK, (1000, 2000), 0, tag=6)],
    ]
    run(three, steps)
    assert (receiver[BLOCK : BLOCK + 1000] == 22).all()
    assert (receiver[BLOCK + 1000 : BLOCK + 2000] == 11).all()
    del sender, receiver


def test_a_killed_peer_fails_the_waiting_step_and_a_new_world_forms_after():
    world = form(2)
    try:
        world[0].engine.submit(Recv(1, BLOCK, (0, 1 << 20), 1, tag=0))
        pid = world[1].engine.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        failed = world[0].next_report()  # long before the world's timeout (WAIT_S)
        assert isinstance(failed, StepFailed) and failed.seq == 1
        assert "closed" in failed.message.lower() or "reset" in failed.message.lower()
        assert isinstance(world[0].next_report(), EngineLost)
        lost = world[1].next_report()
        assert isinstance(lost, EngineLost) and lost.exitcode == -signal.SIGKILL
        again = form(2, regions=[host.region for host in world])
        try:
            count = 1000
            for h, host in enumerate(again):
                host.block("int64", count)[:] = np.arange(count) + h
            owners = even(count, 8, 2)
            steps = [
                [Reduce(1, BLOCK, "int64", ht.HCCL_REDUCE_SUM, owners), Gather(2, BLOCK, owners)]
                for _ in again
            ]
            run(again, steps)
            for host in again:
                assert np.array_equal(host.block("int64", count), 2 * np.arange(count) + 1)
        finally:
            finish(again, close_regions=False)
    finally:
        finish(world)


def test_a_step_no_peer_answers_fails_after_the_worlds_timeout():
    world = form(2, timeout_s=2.0)
    try:
        world[0].engine.submit(Recv(1, BLOCK, (0, 100), 1, tag=0))  # host 1 never sends
        failed = world[0].next_report()
        assert isinstance(failed, StepFailed) and failed.seq == 1
        assert "timed out" in failed.message.lower() or "timeout" in failed.message.lower()
        assert isinstance(world[0].next_report(), EngineLost)
    finally:
        finish(world)


def test_stop_ends_the_process_and_a_missing_segment_is_reported():
    reports: queue.Queue = queue.Queue()
    setup = EngineSetup(0, 1, "127.0.0.1", 0, "/simnpu-no-such-segment", WAIT_S, WAIT_S)
    engine = Engine(setup, reports.put)
    engine.start()
    failed = reports.get(timeout=WAIT_S)
    assert isinstance(failed, StepFailed) and failed.seq == -1
    assert "/simnpu-no-such-segment" in failed.message
    assert isinstance(reports.get(timeout=WAIT_S), EngineLost)
    engine.stop()
    world = form(1)
    pid = world[0].engine.pid
    finish(world)
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_match_compares_every_hosts_call_and_a_mismatch_ends_the_engine():
    world = form(2)
    try:
        run(world, [[Match(1, b"all_reduce(count=4, fp32, sum)")] for _ in world])
        world[0].engine.submit(Match(2, b"all_reduce(count=4, fp32, sum)"))
        world[1].engine.submit(Match(2, b"all_reduce(count=4, fp32, max)"))
        calls = (b"all_reduce(count=4, fp32, sum)", b"all_reduce(count=4, fp32, max)")
        for host in world:
            assert host.next_report() == Mismatch(2, calls)
            assert isinstance(host.next_report(), EngineLost)
    finally:
        finish(world)


def test_gloo_listens_on_the_interface_of_the_advertised_address():
    from simnpu.server.engine_main import interface_of

    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.1") is None  # TEST-NET-1: on no interface here
    assert interface_of("no-such-host.invalid") is None
