"""aclrtValueWrite / aclrtValueWait through acl, against a real daemon: stream-ordered
writes and waits on 64-bit device words, their conditions and their bad input."""

from __future__ import annotations

import ctypes
import struct

import pytest
from conftest import run_client

from simnpu.proto import codes

MASK = (1 << 64) - 1


def _word(acl, ptr) -> int:
    host = ctypes.create_string_buffer(8)
    assert acl.rt.memcpy(ctypes.addressof(host), 8, ptr, 8, acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    return struct.unpack("<Q", host.raw)[0]


def _set_word(acl, ptr, value) -> None:
    data = struct.pack("<Q", value)
    host = ctypes.create_string_buffer(data, 8)
    assert acl.rt.memcpy(ptr, 8, ctypes.addressof(host), 8, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0


def _blocked(acl, stream) -> bool:
    return (
        acl.rt.synchronize_stream_with_timeout(stream, 100)
        == codes.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    )


def test_write_is_stream_ordered(acl):
    ptr, _ = acl.rt.malloc(64, 0)
    stream, _ = acl.rt.create_stream()
    assert acl.rt.memset_async(ptr, 64, 0, 64, stream) == 0
    assert acl.rt.value_write(ptr + 8, MASK, 0, stream) == 0
    assert acl.rt.value_write(ptr + 8, 0x1122334455667788, 0, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert _word(acl, ptr + 8) == 0x1122334455667788
    assert _word(acl, ptr) == 0 and _word(acl, ptr + 16) == 0  # only its 8 bytes
    assert acl.rt.value_write(ptr, 5, 0, 0) == 0  # the default stream
    assert acl.rt.synchronize_stream(0) == 0
    assert _word(acl, ptr) == 5
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(ptr) == 0


def test_wait_released_by_a_write_of_another_stream(acl):
    """The runtime guide's memory-semantic synchronisation: stream 1 waits for the word,
    stream 2 writes it; the work behind the wait runs after."""
    ptr, _ = acl.rt.malloc(64, 0)
    _set_word(acl, ptr, 0)
    waiter, _ = acl.rt.create_stream()
    writer, _ = acl.rt.create_stream()
    assert acl.rt.value_wait(ptr, 2, acl.ACL_STREAM_WAIT_VALUE_EQ, waiter) == 0
    assert acl.rt.value_write(ptr + 8, 9, 0, waiter) == 0  # behind the wait
    assert _blocked(acl, waiter)
    assert acl.rt.value_write(ptr, 1, 0, writer) == 0  # not the value waited for
    assert acl.rt.synchronize_stream(writer) == 0
    assert _blocked(acl, waiter)
    assert acl.rt.value_write(ptr, 2, 0, writer) == 0
    assert acl.rt.synchronize_stream(waiter) == 0
    assert _word(acl, ptr + 8) == 9
    for stream in (waiter, writer):
        assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(ptr) == 0


def test_wait_released_by_a_synchronous_copy(acl):
    """A write no task makes (the session's own synchronous copy) is seen by the re-check
    timer."""
    ptr, _ = acl.rt.malloc(8, 0)
    _set_word(acl, ptr, 0)
    stream, _ = acl.rt.create_stream()
    assert acl.rt.value_wait(ptr, 0x10, acl.ACL_STREAM_WAIT_VALUE_AND, stream) == 0
    assert _blocked(acl, stream)
    _set_word(acl, ptr, 0x30)
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(ptr) == 0


@pytest.mark.parametrize(
    ("flag", "word", "value", "holds"),
    [
        (0, 5, 5, True),  # GEQ: (int64)(word - value) >= 0
        (0, 6, 5, True),
        (0, 4, 5, False),
        (0, 0, MASK, True),  # 0 - (2**64 - 1) wraps to 1
        (0, 1 << 63, 0, False),  # the signed difference is negative
        (1, 7, 7, True),  # EQ
        (1, 7, 8, False),
        (2, 0b0110, 0b0100, True),  # AND: word & value != 0
        (2, 0b0110, 0b1001, False),
        (3, 0, 0, True),  # NOR: ~(word | value) != 0
        (3, MASK, 0, False),
        (3, 0xF0F0, ~0xF0F0 & MASK, False),
        (3, 0xF0F0, 0x0F00, True),
    ],
)
def test_wait_conditions(acl, flag, word, value, holds):
    ptr, _ = acl.rt.malloc(8, 0)
    _set_word(acl, ptr, word)
    stream, _ = acl.rt.create_stream()
    assert acl.rt.value_wait(ptr, value, flag, stream) == 0
    if holds:
        assert acl.rt.synchronize_stream(stream) == 0
    else:
        assert _blocked(acl, stream)
        assert acl.rt.destroy_stream_force(stream) == 0  # drops the wait
        stream = None
    if stream is not None:
        assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free(ptr) == 0


def test_bad_input(acl):
    ptr, _ = acl.rt.malloc(64, 0)
    host, _ = acl.rt.malloc_host(64)
    stream, _ = acl.rt.create_stream()
    for call in (acl.rt.value_write, acl.rt.value_wait):
        assert call(0, 1, 0, stream) == codes.ACL_ERROR_INVALID_PARAM  # null devAddr
        assert call(ptr + 4, 1, 0, stream) == codes.ACL_ERROR_RT_PARAM_INVALID  # unaligned
        assert call(ptr + 64, 1, 0, stream) == codes.ACL_ERROR_RT_PARAM_INVALID  # past its end
        assert call(host, 1, 0, stream) == codes.ACL_ERROR_RT_PARAM_INVALID  # host memory
        assert call(ptr, 1, 0, 12345) == codes.ACL_ERROR_RT_INVALID_HANDLE
        assert call(ptr, 1 << 64, 0, stream) == codes.ACL_ERROR_RT_PARAM_INVALID  # > uint64
        assert call(ptr, -1, 0, stream) == codes.ACL_ERROR_RT_PARAM_INVALID
        with pytest.raises(TypeError):
            call(float(ptr), 1, 0, stream)
    assert acl.rt.value_write(ptr, 1, 1, stream) == codes.ACL_ERROR_RT_PARAM_INVALID  # reserved
    assert acl.rt.value_wait(ptr, 1, 4, stream) == codes.ACL_ERROR_RT_PARAM_INVALID  # no such
    assert acl.rt.synchronize_stream(stream) == 0  # nothing was queued
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.free_host(host) == 0
    assert acl.rt.free(ptr) == 0


def test_another_clients_memory_is_refused(daemon, acl):
    """A word of another client is refused by the daemon too (the client's own check is
    bypassed through the raw command); the daemon and the owner carry on."""
    ptr, _ = acl.rt.malloc(8, 0)
    _set_word(acl, ptr, 77)
    stranger = f"""
        import acl
        from simnpu.client import facade
        from simnpu.proto import commands
        assert acl.rt.set_device(0) == 0
        rt = facade.session()
        stream = rt.contexts.stream(0)
        rt.connection.send_command(commands.ValueWrite.pack({ptr}, 1, 0, stream), "x", stream)
        print(acl.rt.synchronize_stream(0))
        rt.connection.send_command(commands.ValueWait.pack({ptr}, 1, 1, stream), "x", stream)
        print(acl.rt.synchronize_stream(0))
    """
    result = run_client(daemon.address, stranger)
    assert result.stdout.split() == [str(codes.ACL_ERROR_RT_PARAM_INVALID)] * 2, result.stderr
    assert _word(acl, ptr) == 77
    assert acl.rt.free(ptr) == 0


def test_a_client_that_ends_while_waiting(daemon, acl):
    waiting = """
        import acl
        assert acl.rt.set_device(0) == 0
        ptr, _ = acl.rt.malloc(8, 0)
        stream, _ = acl.rt.create_stream()
        assert acl.rt.value_write(ptr, 0, 0, stream) == 0
        assert acl.rt.value_wait(ptr, 1, 1, stream) == 0
        assert acl.rt.synchronize_stream_with_timeout(stream, 50) != 0
        import os
        os._exit(0)
    """
    assert run_client(daemon.address, waiting).returncode == 0
    ptr, _ = acl.rt.malloc(8, 0)  # the daemon serves on
    assert acl.rt.value_write(ptr, 3, 0, 0) == 0
    assert acl.rt.synchronize_stream(0) == 0
    assert _word(acl, ptr) == 3
    assert acl.rt.free(ptr) == 0
