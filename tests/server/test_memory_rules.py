"""Per-client limits and the IPC key table, without a daemon (fake devices and sessions)."""

from __future__ import annotations

import pytest

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.server.memory.ipc_memory import IpcMemory
from simnpu.server.memory.quotas import Limits, mem_info, parse_limit

MiB = 1 << 20


def test_parse_limit():
    assert parse_limit("64MiB", 1 << 30) == 64 * MiB
    assert parse_limit("25%", 256 * MiB) == 64 * MiB
    assert parse_limit("1048576", 0) == MiB
    assert (
        parse_limit("", 1) is None
        and parse_limit("none", 1) is None
        and parse_limit("0", 1) is None
    )
    for bad in ("abc", "150%", "0%", "-5MiB"):
        with pytest.raises(ValueError):
            parse_limit(bad, 1 << 30)


def test_limits_only_go_down_and_zero_restores_the_default():
    limits = Limits(32 * MiB, devices=2)
    assert limits.of(0) == limits.of(1) == 32 * MiB
    limits.set(1, 8 * MiB)
    assert (limits.of(0), limits.of(1)) == (32 * MiB, 8 * MiB)
    with pytest.raises(NpuError) as error:
        limits.set(None, 64 * MiB)
    assert error.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    assert limits.of(1) == 8 * MiB  # unchanged by the refused call
    limits.set(None, 0)
    assert (limits.of(0), limits.of(1)) == (32 * MiB, 32 * MiB)
    unlimited = Limits(None, devices=1)
    assert unlimited.of(0) is None
    unlimited.set(0, 1 << 40)  # no default: any limit is a lowering
    assert unlimited.of(0) == 1 << 40


def test_mem_info_under_a_limit():
    assert mem_info(None, 5, 100, 1000) == (100, 1000)
    assert mem_info(64, 16, 1000, 4096) == (48, 64)
    assert mem_info(64, 16, 10, 4096) == (10, 64)  # the device has less left than the limit
    assert mem_info(8, 16, 1000, 4096) == (0, 8)  # holds more than a lowered limit


class FakeDevice:
    def __init__(self):
        self.freed = []

    def free(self, address):
        self.freed.append(address)


class FakeSession:
    def __init__(self, pid):
        self.pid = pid

    def __repr__(self):
        return f"session (pid {self.pid})"


@pytest.fixture
def ipc():
    device = FakeDevice()
    table = IpcMemory([device])
    table.device = device
    return table


def _export(ipc, owner, flags=0, address=0x1000, size=256):
    return ipc.export(owner, address, size, flags, (address, 4096), 0)


def test_whitelist_and_pairing(ipc):
    a, b, c = FakeSession(1), FakeSession(2), FakeSession(3)
    key = _export(ipc, a)
    with pytest.raises(NpuError) as error:
        ipc.import_(b, key, 0, b.pid)
    assert error.value.code == codes.ACL_ERROR_RT_NO_PERMISSION
    with pytest.raises(NpuError):
        ipc.set_import_pid(b, key, [2])  # only the exporter may
    ipc.set_import_pid(a, key, [2])
    assert ipc.import_(b, key, 0, b.pid).address == 0x1000
    assert ipc.import_(b, key, 0, b.pid).size == 256  # a second import: a second close is owed
    with pytest.raises(NpuError):
        ipc.import_(c, key, 0, c.pid)
    with pytest.raises(NpuError):
        ipc.import_(a, key, 0, a.pid)  # its own key
    assert ipc.close(b, key) is None
    assert ipc.close(b, key) is not None  # the last close of b's imports
    with pytest.raises(NpuError):
        ipc.close(b, key)
    ipc.close(a, key)
    assert ipc.counts() == {"ipc.exported_keys": 0, "ipc.open_imports": 0, "ipc.held_blocks": 0}
    assert ipc.owner_frees(a, 0x1000) is False  # nothing holds it: the caller frees


def test_owner_free_while_imported_is_held_until_the_last_close(ipc):
    a, b, c = FakeSession(1), FakeSession(2), FakeSession(3)
    key = _export(ipc, a, flags=1)
    ipc.import_(b, key, 0, b.pid)
    ipc.import_(c, key, 0, c.pid)
    assert ipc.owner_frees(a, 0x1000) is True
    assert ipc.describe(0x1000)["held_after_free"] is True
    with pytest.raises(NpuError):
        ipc.import_(FakeSession(4), key, 0, 4)  # freed memory cannot be imported
    ipc.close(b, key)
    assert ipc.device.freed == []
    ipc.session_ended(c, [key])  # c exits without closing
    assert ipc.device.freed == [0x1000]
    assert ipc.counts()["ipc.held_blocks"] == 0
    assert ipc.describe(0x1000) is None


def test_exporter_close_before_importers_keeps_their_access(ipc):
    a, b = FakeSession(1), FakeSession(2)
    key = _export(ipc, a, flags=1)
    ipc.import_(b, key, 0, b.pid)
    assert ipc.close(a, key) is None  # out of ACL's order: logged, importers keep access
    with pytest.raises(NpuError):
        ipc.import_(FakeSession(3), key, 0, 3)
    assert ipc.close(b, key) is not None
    assert ipc.owner_frees(a, 0x1000) is False


def test_export_checks(ipc):
    a = FakeSession(1)
    for args in ((0x1000, 0, 0), (0x1000, 8192, 0), (0x1000, 16, 5)):
        with pytest.raises(NpuError) as error:
            ipc.export(a, *args, (0x1000, 4096), 0)
        assert error.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    with pytest.raises(NpuError):
        ipc.set_import_pid(a, _export(ipc, a), [])
