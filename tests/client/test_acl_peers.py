"""Peer access between the devices of one daemon through acl (aclrtDevice*PeerAccess*), and
the rule copies between two devices follow, against a real daemon with two devices."""

from __future__ import annotations

import ctypes

import pytest
from conftest import DaemonProcess

from simnpu.proto import codes

SIZE = 4096


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    process = DaemonProcess(tmp_path_factory.mktemp("peers"), "--devices", "2", "--memory", "64MiB")
    yield process
    assert process.stop() == 0, process.output()


@pytest.fixture
def acl(two_devices, monkeypatch):
    import acl

    monkeypatch.setenv("SIMNPU_ADDRESS", two_devices.address)
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    acl.get_recent_err_msg()
    yield acl
    for device in (0, 1):
        acl.rt.reset_device_force(device)
    assert acl.finalize() == 0


def test_can_access_and_status(acl):
    assert acl.rt.device_can_access_peer(0, 1) == (1, 0)
    assert acl.rt.device_can_access_peer(1, 0) == (1, 0)
    assert acl.rt.device_peer_access_status(0, 1) == (0, 0)
    assert acl.rt.device_enable_peer_access(1, 0) == 0
    assert acl.rt.device_peer_access_status(0, 1) == (1, 0)
    assert acl.rt.device_peer_access_status(1, 0) == (0, 0)  # one direction only
    assert acl.rt.device_enable_peer_access(1, 0) == 0  # again: still enabled
    assert acl.rt.device_disable_peer_access(1) == 0
    assert acl.rt.device_peer_access_status(0, 1) == (0, 0)


def test_bad_devices_and_flags(acl):
    assert acl.rt.device_can_access_peer(0, 0) == (0, codes.ACL_ERROR_INVALID_PARAM)
    assert "cannot be equal" in acl.get_recent_err_msg()
    assert acl.rt.device_can_access_peer(0, 2) == (0, codes.ACL_ERROR_RT_INVALID_DEVICEID)
    assert acl.rt.device_can_access_peer(-1, 0) == (0, codes.ACL_ERROR_RT_INVALID_DEVICEID)
    assert acl.rt.device_enable_peer_access(0, 0) == codes.ACL_ERROR_INVALID_PARAM
    assert acl.rt.device_enable_peer_access(5, 0) == codes.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.device_enable_peer_access(1, 1) == codes.ACL_ERROR_FEATURE_UNSUPPORTED
    assert acl.rt.device_disable_peer_access(0) == codes.ACL_ERROR_INVALID_PARAM
    assert acl.rt.device_disable_peer_access(7) == codes.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.device_peer_access_status(0, 2) == (0, codes.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.device_peer_access_status(-1, 1) == (0, codes.ACL_ERROR_RT_PARAM_INVALID)
    with pytest.raises(TypeError):
        acl.rt.device_can_access_peer(0.0, 1)
    assert acl.rt.device_can_access_peer(0, 1) == (1, 0)  # the session is unharmed


def test_peer_copy_follows_the_sample(acl):
    """The runtime's device P2P sample: enable both ways, copy device 0 -> device 1."""
    assert acl.rt.device_enable_peer_access(1, 0) == 0
    dev0, ret = acl.rt.malloc(SIZE, codes.ACL_MEM_MALLOC_HUGE_FIRST_P2P)
    assert ret == 0
    assert acl.rt.memset(dev0, SIZE, 0x5C, SIZE) == 0
    assert acl.rt.set_device(1) == 0
    dev1, ret = acl.rt.malloc(SIZE, codes.ACL_MEM_MALLOC_HUGE_FIRST_P2P)
    assert ret == 0
    assert acl.rt.memset(dev1, SIZE, 0, SIZE) == 0
    # device 1 has not enabled access to device 0 yet: the copy it would run is refused
    assert (
        acl.rt.memcpy(dev1, SIZE, dev0, SIZE, codes.ACL_MEMCPY_DEVICE_TO_DEVICE)
        == codes.ACL_ERROR_RT_PARAM_INVALID
    )
    assert "aclrtDeviceEnablePeerAccess(0, 0)" in acl.get_recent_err_msg()
    assert acl.rt.device_enable_peer_access(0, 0) == 0
    assert acl.rt.memcpy(dev1, SIZE, dev0, SIZE, codes.ACL_MEMCPY_DEVICE_TO_DEVICE) == 0
    host = ctypes.create_string_buffer(SIZE)
    assert acl.rt.memcpy(ctypes.addressof(host), SIZE, dev1, SIZE, 2) == 0
    assert host.raw == b"\x5c" * SIZE
    # stream-ordered: a stream of device 1 copies back into device 0
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    assert acl.rt.memset(dev1, SIZE, 0x11, SIZE) == 0
    assert acl.rt.memcpy_async(dev0, SIZE, dev1, SIZE, 3, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.memcpy(ctypes.addressof(host), SIZE, dev0, SIZE, 2) == 0
    assert host.raw == b"\x11" * SIZE
    assert acl.rt.device_disable_peer_access(0) == 0
    assert (
        acl.rt.memcpy_async(dev0, SIZE, dev1, SIZE, 3, stream) == codes.ACL_ERROR_RT_PARAM_INVALID
    )
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(dev1) == 0
    assert acl.rt.set_device(0) == 0
    assert acl.rt.device_disable_peer_access(1) == 0
    assert acl.rt.free(dev0) == 0
