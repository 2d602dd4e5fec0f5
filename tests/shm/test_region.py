"""Region: create / attach / close / unlink of named shared-memory segments."""

import ctypes
import itertools
import os

import numpy as np
import posix_ipc
import pytest

from simnpu.shm.region import Region, segment_name, unlink_quietly

_names = itertools.count()


def shm_path(name: str) -> str:
    return "/dev/shm/" + name.lstrip("/")


@pytest.fixture
def name():
    """A fresh segment name of this process; whatever is left under it is removed after."""
    made = segment_name("test-region", next(_names))
    yield made
    unlink_quietly(made)


def test_segment_names_carry_the_creating_pid():
    assert segment_name("dev0") == f"/simnpu-{os.getpid()}-dev0"
    assert segment_name("s3", "pin7") == f"/simnpu-{os.getpid()}-s3-pin7"


def test_create_makes_an_owner_only_segment_of_the_size(name):
    region = Region.create(name, 1 << 16)
    try:
        assert region.owner and region.size == 1 << 16 and len(region.map) == 1 << 16
        stat = os.stat(shm_path(name))
        assert stat.st_size == 1 << 16
        assert stat.st_mode & 0o777 == 0o600
    finally:
        region.close()


def test_create_fails_when_the_name_exists(name):
    region = Region.create(name, 4096)
    try:
        with pytest.raises(posix_ipc.ExistentialError):
            Region.create(name, 8192)
        assert os.stat(shm_path(name)).st_size == 4096
    finally:
        region.close()


def test_attach_sees_the_owners_bytes_both_ways(name):
    owner = Region.create(name, 8192)
    other = Region.attach(name)
    try:
        assert not other.owner and other.size == 8192
        owner.map[100:105] = b"hello"
        assert other.map[100:105] == b"hello"
        other.map[8000:8003] = b"abc"
        assert owner.map[8000:8003] == b"abc"
    finally:
        other.close()
        owner.close()


def test_attach_never_resizes(name):
    owner = Region.create(name, 12345)
    try:
        for _ in range(3):
            attached = Region.attach(name)
            assert attached.size == 12345
            attached.close()
        assert os.stat(shm_path(name)).st_size == 12345
        assert owner.size == len(owner.map) == 12345
    finally:
        owner.close()


def test_attach_to_a_missing_segment_raises(name):
    with pytest.raises(posix_ipc.ExistentialError):
        Region.attach(name)
    assert not os.path.exists(shm_path(name))


def test_a_segment_too_big_to_map_is_not_left_behind(name):
    with pytest.raises(OSError):
        Region.create(name, 1 << 62)
    assert not os.path.exists(shm_path(name))


def test_owner_close_unlinks_and_is_idempotent(name):
    region = Region.create(name, 4096)
    region.close()
    assert not os.path.exists(shm_path(name))
    region.close()  # harmless twice
    assert region.map.closed


def test_attached_close_leaves_the_segment_to_its_owner(name):
    owner = Region.create(name, 4096)
    attached = Region.attach(name)
    attached.close()
    attached.close()
    assert os.path.exists(shm_path(name))
    owner.map[0:3] = b"xyz"
    assert Region.attach(name).map[0:3] == b"xyz"
    owner.close()
    assert not os.path.exists(shm_path(name))


def test_unlink_keeps_mappings_valid(name):
    owner = Region.create(name, 4096)
    attached = Region.attach(name)
    owner.unlink()
    assert not os.path.exists(shm_path(name))
    owner.map[10:12] = b"ok"
    assert attached.map[10:12] == b"ok"
    with pytest.raises(posix_ipc.ExistentialError):
        Region.attach(name)
    attached.close()
    owner.close()  # the name is gone already: still fine


def test_unlink_by_an_attacher_does_nothing(name):
    owner = Region.create(name, 4096)
    attached = Region.attach(name)
    attached.unlink()
    assert os.path.exists(shm_path(name))
    attached.close()
    owner.close()


def test_close_with_a_live_numpy_view_raises_buffer_error(name):
    region = Region.create(name, 4096)
    view = np.frombuffer(region.map, np.uint8, 16, 64)
    with pytest.raises(BufferError):
        region.close()
    assert not region.map.closed  # the mapping, and so the view, stay valid
    view[:] = 7
    assert region.map[64:80] == b"\x07" * 16
    del view
    region.close()
    assert region.map.closed and not os.path.exists(shm_path(name))


def test_close_of_an_attached_region_with_a_live_view_raises(name):
    owner = Region.create(name, 4096)
    attached = Region.attach(name)
    view = memoryview(attached.map)
    with pytest.raises(BufferError):
        attached.close()
    view.release()
    attached.close()
    owner.close()


def test_address_is_the_mapping_in_this_process(name):
    region = Region.create(name, 4096)
    try:
        region.map[200:204] = b"\x01\x02\x03\x04"
        address = region.address()
        assert ctypes.string_at(address + 200, 4) == b"\x01\x02\x03\x04"
        ctypes.memmove(address + 300, b"zz", 2)
        assert region.map[300:302] == b"zz"
    finally:
        region.close()  # address() left no export behind


def _backed(name: str) -> int:
    """Bytes of the segment's file that have pages."""
    return os.stat(shm_path(name)).st_blocks * 512


def test_a_new_segment_is_sparse_and_commit_backs_exactly_the_range(name):
    region = Region.create(name, 64 << 20)
    try:
        assert _backed(name) == 0
        region.commit(8 << 20, 4 << 20)
        assert _backed(name) == 4 << 20
        attached = Region.attach(name)  # another mapping sees the same pages
        attached.map[8 << 20] = 5
        assert region.map[8 << 20] == 5
        attached.close()
        region.decommit(0, 64 << 20)  # holes cost nothing to punch again
        assert _backed(name) == 0
        assert region.map[8 << 20] == 0  # a decommitted range reads zeros
    finally:
        region.close()


def test_commit_without_madvise_populate_touches_one_byte_per_page(name, monkeypatch):
    """On kernels before 5.14 MADV_POPULATE_WRITE is EINVAL: commit writes the pages."""
    import simnpu.shm.pages as pages

    monkeypatch.setattr(pages, "MADV_POPULATE_WRITE", 0x7FFF)  # no such advice
    region = Region.create(name, 1 << 20)
    try:
        region.commit(4096, 3 * 4096 + 1)
        assert _backed(name) == 4 * 4096
    finally:
        region.close()
