"""DeviceBacking and BackingLog (server/memory/device_backing.py) on real segments: a
client's blocks live in a file of its own, mapped into the daemon's window at their
offsets; the log carries every change, or the whole map to a process far behind."""

from __future__ import annotations

import os
import secrets

import pytest

from simnpu.server.core.owner import Owner
from simnpu.server.memory import device_backing
from simnpu.server.memory.device_backing import Backing, BackingLog, DeviceBacking
from simnpu.shm.region import Region, segment_name

PAGE = 4096
SIZE = 64 * PAGE


@pytest.fixture
def device():
    region = Region.create(segment_name("backing-test", secrets.token_hex(4)), SIZE, device=True)
    backing = DeviceBacking(0, region, BackingLog())
    yield backing
    backing.close()
    region.close()


def owner(number: int) -> Owner:
    return Owner(number, lambda callback: None)


def file_bytes(name: str, offset: int, length: int) -> bytes:
    with open("/dev/shm" + name, "rb") as file:
        file.seek(offset)
        return file.read(length)


def test_a_clients_block_lives_in_its_own_file_at_its_offset(device):
    alice = owner(1)
    device.assign(4 * PAGE, 2 * PAGE, alice)
    name = device.source_of(alice)
    assert name != device.region.name and name.endswith("-s1-dev0")
    device.region.map[4 * PAGE : 4 * PAGE + 5] = b"alice"
    assert file_bytes(name, 4 * PAGE, 5) == b"alice"
    assert file_bytes(device.region.name, 4 * PAGE, 5) == bytes(5), "not in the device's segment"
    assert device.sources(3 * PAGE, 4 * PAGE) == [
        (3 * PAGE, PAGE, device.region.name),
        (4 * PAGE, 2 * PAGE, name),
        (6 * PAGE, PAGE, device.region.name),
    ]


def test_memory_of_no_client_stays_in_the_devices_segment(device):
    device.assign(0, PAGE, object())
    assert device.sources(0, SIZE) == [(0, SIZE, device.region.name)]
    assert device.log.version == 0, "nothing changed"


def test_reassigned_pages_lose_the_last_owners_bytes(device):
    alice, bob = owner(1), owner(2)
    device.assign(0, PAGE, alice)
    device.region.map[0:6] = b"secret"
    device.assign(0, PAGE, bob)  # alice freed it; bob's block lands on the page
    assert device.region.map[0:6] == bytes(6)
    assert file_bytes(device.source_of(alice), 0, 6) == bytes(6), "punched out of alice's file"


def test_runs_split_and_merge(device):
    alice, bob = owner(1), owner(2)
    for start in range(0, 8 * PAGE, PAGE):  # alternating pages
        device.assign(start, PAGE, alice if start // PAGE % 2 == 0 else bob)
    assert len(device.runs()) == 9  # 8 pages, then the rest of the device's segment
    device.assign(PAGE, PAGE, alice)  # alice, alice, alice, bob, ...
    runs = device.runs()
    assert runs[0] == Backing(device.region.name, 0, 3 * PAGE, device.source_of(alice))
    assert sum(run.length for run in runs) == SIZE
    assert all(a.offset + a.length == b.offset for a, b in zip(runs, runs[1:]))
    assert all(a.source != b.source for a, b in zip(runs, runs[1:])), "equal neighbours merge"


def test_an_owner_gone_gives_its_runs_back_and_its_file_goes(device):
    alice = owner(1)
    device.assign(2 * PAGE, 3 * PAGE, alice)
    name = device.source_of(alice)
    device.region.map[2 * PAGE : 2 * PAGE + 5] = b"alice"
    device.owner_gone(alice)
    assert not os.path.exists("/dev/shm" + name)
    assert device.runs() == [Backing(device.region.name, 0, SIZE, device.region.name)]
    assert device.region.map[2 * PAGE : 2 * PAGE + 5] == bytes(5)
    assert device.source_of(alice) == device.region.name


def test_the_log_gives_changes_in_order_or_the_whole_map(device, monkeypatch):
    log = device.log
    alice, bob = owner(1), owner(2)
    device.assign(0, PAGE, alice)
    device.assign(PAGE, PAGE, bob)
    version, changes, whole = log.since(0)
    assert (version, whole) == (2, False)
    assert [(c.offset, c.source) for c in changes] == [
        (0, device.source_of(alice)),
        (PAGE, device.source_of(bob)),
    ]
    assert log.since(2) == (2, (), False)
    version, changes, whole = log.since(-1)  # a process that has seen nothing
    assert whole and changes == tuple(device.runs())
    monkeypatch.setattr(device_backing, "LOG_KEPT", 2)
    device.assign(2 * PAGE, PAGE, alice)
    device.assign(3 * PAGE, PAGE, bob)
    _, changes, whole = log.since(1)  # older than what the log keeps
    assert whole and changes == tuple(device.runs())
    _, changes, whole = log.since(3)
    assert not whole and [c.offset for c in changes] == [3 * PAGE]


def test_exported_pages_move_into_a_file_of_their_block_with_their_bytes(device):
    """An export (aclrtIpcMemGetExportKey) moves the exported pages of a block into a file
    of that block alone: their bytes come along, the owner's file keeps its other blocks
    and loses the moved pages."""
    alice = owner(1)
    device.assign(0, 2 * PAGE, alice)  # another block of alice: stays in her file
    device.assign(4 * PAGE, 4 * PAGE, alice)  # the block, at 4 pages
    own = device.source_of(alice)
    device.region.map[0:6] = b"secret"
    device.region.map[5 * PAGE : 5 * PAGE + 6] = b"shared"
    assert device.unshared(4 * PAGE, 5 * PAGE, 2 * PAGE)
    changes = device.share(4 * PAGE, 5 * PAGE, 2 * PAGE, alice)  # pages 5 and 6 only
    name = changes[0].source
    assert name.endswith("-s1-dev0-b4000") and name != own
    assert [(c.offset, c.length) for c in changes] == [(5 * PAGE, 2 * PAGE)]
    assert device.region.map[5 * PAGE : 5 * PAGE + 6] == b"shared", "the daemon's window"
    assert file_bytes(name, 5 * PAGE, 6) == b"shared"
    assert file_bytes(own, 5 * PAGE, 6) == bytes(6), "punched out of alice's file"
    assert b"secret" not in file_bytes(name, 0, SIZE), "nothing else of alice's"
    assert device.sources(4 * PAGE, 4 * PAGE) == [
        (4 * PAGE, PAGE, own),
        (5 * PAGE, 2 * PAGE, name),
        (7 * PAGE, PAGE, own),
    ]
    assert device.log.since(device.log.version - 1)[1] == tuple(changes)
    assert not device.unshared(4 * PAGE, 5 * PAGE, 2 * PAGE)
    assert device.share(4 * PAGE, 5 * PAGE, 2 * PAGE, alice) == [], "a second export moves nothing"
    device.release(4 * PAGE)  # the block is freed
    assert not os.path.exists("/dev/shm" + name)
    assert device.sources(5 * PAGE, 2 * PAGE) == [(5 * PAGE, 2 * PAGE, device.region.name)]
    assert device.region.map[5 * PAGE : 5 * PAGE + 6] == bytes(6)


def test_the_daemons_end_removes_the_files_of_exported_blocks(device):
    alice = owner(1)
    device.assign(0, PAGE, alice)
    own = device.source_of(alice)
    name = device.share(0, 0, PAGE, alice)[0].source
    device.close()
    assert not os.path.exists("/dev/shm" + name)
    assert not os.path.exists("/dev/shm" + own)
