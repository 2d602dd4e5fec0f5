"""Bad input gets its ACL code, and the daemon, the same client and every other client keep
working.

Each case is tried twice where it can be: through the raw runtime layer (which checks
what the host can check, at once, before anything is sent), and straight at the daemon
with the raw layer's checks skipped (`daemon_code`, `deferred_code`, or a hand-made gRPC
session), because a client is not obliged to use our client library.

After every test the `checked` fixture proves that the test's own client still does a
malloc + copy + kernel + synchronize round trip, and that a bystander client of the same
daemon, whose data sits on the device the whole time, still has its data intact and works.
"""

from __future__ import annotations

import ctypes
import os
import queue
import subprocess
import sys
import textwrap
import threading
from contextlib import contextmanager

import grpc
import numpy as np
import pytest
from conftest import round_trip, run_client
from google.protobuf import message_factory
from google.protobuf.message import Message

from simnpu.client.runtime import Runtime
from simnpu.proto import bulk as wire
from simnpu.proto import codes, commands, messages, npu_pb2, service
from simnpu.proto.commands import Location
from simnpu.proto.errors import NpuError, NpuMemoryError
from simnpu.shm.addresses import DEVICE_BASE, DEVICE_SPAN

H2H = codes.ACL_MEMCPY_HOST_TO_HOST
H2D = codes.ACL_MEMCPY_HOST_TO_DEVICE
D2H = codes.ACL_MEMCPY_DEVICE_TO_HOST
D2D = codes.ACL_MEMCPY_DEVICE_TO_DEVICE
PARAM = codes.ACL_ERROR_RT_PARAM_INVALID
HANDLE = codes.ACL_ERROR_RT_INVALID_HANDLE
NULL = codes.ACL_ERROR_INVALID_PARAM
N = 4096
MiB = 1 << 20


# ---- helpers ----------------------------------------------------------------------------------
def client(address: str) -> Runtime:
    rt = Runtime(address)
    rt.contexts.set_device(0)
    return rt


class Bystander:
    """A client that keeps 1 MiB of data, a stream and an event on the device all along.

    It burns handle numbers first, so its handles are numbers no fresh session owns:
    handles are per session, so another session's *own* stream may well carry the same
    number as this one's second stream -- that would be its stream, not a foreign one.
    """

    def __init__(self, address: str):
        self.rt = client(address)
        for _ in range(64):
            self.rt.events.destroy_event(self.rt.events.create_event())
        self.data = np.random.default_rng(7).integers(0, 256, MiB, dtype=np.uint8)
        self.ptr = self.rt.memory.malloc(self.data.nbytes)
        self.rt.memory.memcpy(
            self.ptr, self.data.nbytes, self.data.ctypes.data, self.data.nbytes, H2D
        )
        self.stream = self.rt.streams.create_stream()
        self.event = self.rt.events.create_event()
        self.context = self.rt.contexts.create_context(0)  # a context of its own, not current
        self.rt.contexts.set_device(0)
        self.pinned = self.rt.host.malloc_host(4096)
        self.pinned_handle = self.rt.host.find(self.pinned).handle
        ctypes.memset(self.pinned, 0x5A, 4096)

    def check(self) -> None:
        out = np.zeros_like(self.data)
        self.rt.memory.memcpy(out.ctypes.data, out.nbytes, self.ptr, out.nbytes, D2H)
        assert np.array_equal(out, self.data), (
            "another client's bad input changed the bystander's memory"
        )
        assert ctypes.string_at(self.pinned, 4096) == b"\x5a" * 4096
        self.rt.events.record_event(self.event, self.stream)
        self.rt.sync.synchronize_event(self.event)
        round_trip(self.rt, 2.0)

    def close(self) -> None:
        self.rt.close()


@pytest.fixture(scope="module")
def bystander(daemon):
    made = Bystander(daemon.address)
    yield made
    made.close()


@pytest.fixture
def rt(daemon, bystander):
    """This test's client (device 0 set). Afterwards it and the bystander must still work."""
    made = client(daemon.address)
    yield made
    round_trip(made)
    made.close()
    bystander.check()


@pytest.fixture
def other(daemon):
    """A second client of this process (its own session), for cross-client cases."""
    made = client(daemon.address)
    yield made
    made.close()


@contextmanager
def raises_at_once(rt: Runtime, code: int):
    """The raw layer rejects the call with `code` before sending anything to the daemon."""
    before = rt.connection.log.seq
    with pytest.raises(NpuError) as caught:
        yield caught
    assert caught.value.code == code, caught.value
    assert rt.connection.log.seq == before, "the call was sent to the daemon before being rejected"


def daemon_code(rt: Runtime, body: Message) -> int:
    """Send a request with this body as is, skipping every check of the raw layer; the code
    of its reply."""
    try:
        rt.connection.call(body)
    except NpuError as error:
        return error.code
    return codes.ACL_SUCCESS


def deferred_code(rt: Runtime, *records: bytes) -> int:
    """Send asynchronous command records as is; the code the next synchronize reports."""
    for record in records:
        rt.connection.send_command(record, "test")
    try:
        rt.sync.synchronize_stream(0)
    except NpuError as error:
        code = error.code
    else:
        code = codes.ACL_SUCCESS
    rt.sync.synchronize_stream(0)  # a rejected call is reported once, then the stream is fine
    return code


def to_device(rt: Runtime, ptr: int, data: bytes) -> None:
    staged = np.frombuffer(data, np.uint8).copy()
    rt.memory.memcpy(ptr, staged.nbytes, staged.ctypes.data, staged.nbytes, H2D)


def within(seconds: float, rt: Runtime, call, *args) -> None:
    """Run `call(*args)` with `rt`'s current context; fail (instead of hanging the run) if it
    has not returned in time."""
    outcome: list = []
    context = rt.contexts.get_context()

    def run() -> None:
        try:
            rt.contexts.set_context(context)
            call(*args)
            outcome.append(None)
        except Exception as error:  # noqa: BLE001  (handed to the test's thread)
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, (
        f"{getattr(call, '__name__', call)} did not return within {seconds} s: the daemon hangs"
    )
    if outcome[0] is not None:
        raise outcome[0]


def dev(address: int) -> Location:
    """Device memory at `address`, as a command record names it."""
    return Location(commands.SPACE_DEVICE, 0, address)


def where(space: int, id: int, offset: int) -> npu_pb2.Location:
    """A memory location, as a request body names it."""
    return npu_pb2.Location(space=space, id=id, offset=offset)


def on_device(address: int) -> npu_pb2.Location:
    """Device memory at `address`, as a request body names it."""
    return where(commands.SPACE_DEVICE, 0, address)


def staging_at(offset: int) -> npu_pb2.Location:
    """The session's staging area at `offset`, as a request body names it."""
    return where(commands.SPACE_STAGING, 0, offset)


def host_array(n: int = N, value: int = 1) -> np.ndarray:
    return np.full(n, value, np.uint8)


# ---- stale, unknown and foreign handles ----------------------------------------------------------
def test_destroyed_stream_is_rejected_at_once_by_every_call(rt):
    stream = rt.streams.create_stream()
    rt.streams.destroy_stream(stream)
    ptr = rt.memory.malloc(N)
    data = host_array()
    add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    args = rt.kernels.signature(add).pack(ptr, ptr, ptr, 16)
    event = rt.events.create_event()
    calls = [
        lambda: rt.sync.synchronize_stream(stream),
        lambda: rt.sync.stream_query(stream),
        lambda: rt.streams.destroy_stream(stream),
        lambda: rt.streams.set_stream_failure_mode(stream, codes.ACL_STOP_ON_FAILURE),
        lambda: rt.kernels.launch_kernel(add, 1, args, stream),
        lambda: rt.memory.memcpy_async(ptr, N, data.ctypes.data, N, H2D, stream),
        lambda: rt.memory.memset_async(ptr, N, 0, N, stream),
        lambda: rt.events.record_event(event, stream),
        lambda: rt.events.reset_event(event, stream),
        lambda: rt.events.stream_wait_event(stream, event),
    ]
    for call in calls:
        with raises_at_once(rt, HANDLE):
            call()
    rt.events.destroy_event(event)
    rt.memory.free(ptr)


def test_destroyed_stream_at_the_daemon(rt):
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    rt.streams.destroy_stream(stream)
    ptr = rt.memory.malloc(N)
    add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    args = rt.kernels.signature(add).pack(ptr, ptr, ptr, 16)
    assert daemon_code(rt, npu_pb2.SynchronizeStreamRequest(stream=stream, timeout_ms=-1)) == HANDLE
    assert daemon_code(rt, npu_pb2.QueryStreamRequest(stream=stream)) == HANDLE
    assert daemon_code(rt, npu_pb2.DestroyStreamRequest(stream=stream, force=False)) == HANDLE
    assert (
        daemon_code(rt, npu_pb2.MemsetRequest(stream=stream, dst=on_device(ptr), value=1, count=16))
        == HANDLE
    )
    assert deferred_code(rt, commands.Launch.pack(1, stream, add, args)) == HANDLE
    assert deferred_code(rt, commands.Memset.pack(stream, dev(ptr), 0, 16)) == HANDLE
    assert deferred_code(rt, commands.Copy.pack(stream, dev(ptr), dev(ptr + 64), 16)) == HANDLE
    assert deferred_code(rt, commands.RecordEvent.pack(event, stream)) == HANDLE
    rt.memory.free(ptr)


def test_destroyed_event_is_rejected(rt):
    event = rt.events.create_event()
    rt.events.destroy_event(event)
    for call in (
        lambda: rt.events.record_event(event, 0),
        lambda: rt.events.reset_event(event, 0),
        lambda: rt.events.stream_wait_event(0, event),
        lambda: rt.sync.synchronize_event(event),
        lambda: rt.sync.query_event_status(event),
        lambda: rt.events.destroy_event(event),
        lambda: rt.events.event_elapsed_time(event, event),
    ):
        with raises_at_once(rt, HANDLE):
            call()
    default = rt.contexts.stream(0)
    for kind in (commands.RecordEvent, commands.ResetEvent, commands.WaitEvent):
        assert deferred_code(rt, kind.pack(event, default)) == HANDLE
    assert daemon_code(rt, npu_pb2.SynchronizeEventRequest(event=event, timeout_ms=-1)) == HANDLE
    assert daemon_code(rt, npu_pb2.QueryEventRequest(event=event)) == HANDLE
    assert daemon_code(rt, npu_pb2.DestroyEventRequest(event=event)) == HANDLE


def test_handles_of_a_destroyed_context_are_stale(rt):
    context = rt.contexts.create_context(0)
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    rt.contexts.destroy_context(context)
    rt.contexts.set_device(0)
    with raises_at_once(rt, HANDLE):
        rt.contexts.set_context(context)
    with raises_at_once(rt, HANDLE):
        rt.sync.synchronize_stream(stream)
    with raises_at_once(rt, HANDLE):
        rt.events.record_event(event, 0)
    assert (
        daemon_code(rt, npu_pb2.CreateStreamRequest(context=context, priority=0, flags=0)) == HANDLE
    )
    assert daemon_code(rt, npu_pb2.SynchronizeStreamRequest(stream=stream, timeout_ms=-1)) == HANDLE
    assert daemon_code(rt, npu_pb2.DestroyContextRequest(context=context)) == HANDLE


def test_unknown_handles_are_rejected(rt):
    bogus = 0xDEAD_BEEF
    with raises_at_once(rt, HANDLE):
        rt.sync.synchronize_stream(bogus)
    with raises_at_once(rt, HANDLE):
        rt.events.record_event(bogus, 0)
    with raises_at_once(rt, HANDLE):
        rt.kernels.get_function(bogus, "add_f32")
    with raises_at_once(rt, HANDLE):
        rt.kernels.launch_kernel(bogus, 1, b"", 0)
    with raises_at_once(rt, HANDLE):
        rt.contexts.set_context(bogus)
    default = rt.contexts.stream(0)
    assert (
        daemon_code(rt, npu_pb2.CreateStreamRequest(context=bogus, priority=0, flags=0)) == HANDLE
    )
    assert daemon_code(rt, npu_pb2.CreateEventRequest(context=bogus, flags=0)) == HANDLE
    assert daemon_code(rt, npu_pb2.GetFunctionRequest(binary=bogus, name="add_f32")) == HANDLE
    assert daemon_code(rt, npu_pb2.BinaryUnloadRequest(binary=bogus)) == HANDLE
    assert daemon_code(rt, npu_pb2.FreeHostRequest(segment=bogus)) == HANDLE
    assert deferred_code(rt, commands.Launch.pack(1, default, bogus, b"")) == HANDLE
    # a handle of the wrong kind is no better than an unknown one
    assert (
        daemon_code(
            rt, npu_pb2.SynchronizeStreamRequest(stream=rt.contexts.get_context(), timeout_ms=-1)
        )
        == HANDLE
    )
    assert daemon_code(rt, npu_pb2.QueryEventRequest(event=default)) == HANDLE
    assert (
        deferred_code(rt, commands.Launch.pack(1, default, commands.BUILTIN_BINARY, b"")) == HANDLE
    )


def test_functions_of_an_unloaded_binary_are_stale(rt):
    binary = rt.kernels.binary_load(
        "from simnpu import kernel\n@kernel('u32')\ndef nop(ctx, n):\n    pass\n"
    )
    function = rt.kernels.get_function(binary, "nop")
    rt.kernels.binary_unload(binary)
    with raises_at_once(rt, HANDLE):
        rt.kernels.get_function(binary, "nop")
    with raises_at_once(rt, HANDLE):
        rt.kernels.binary_unload(binary)
    # the raw layer still knows the function's signature; the daemon knows it is gone
    with pytest.raises(NpuError) as caught:
        rt.kernels.launch_kernel(function, 1, b"\0\0\0\0", 0)
        rt.sync.synchronize_stream(0)
    assert caught.value.code == HANDLE
    rt.sync.synchronize_stream(0)


def test_the_builtin_library_cannot_be_unloaded(rt):
    with pytest.raises(NpuError) as caught:
        rt.kernels.binary_unload(commands.BUILTIN_BINARY)
    assert caught.value.code == PARAM
    round_trip(rt)


def test_handles_of_another_client_in_this_process(rt, bystander):
    foreign_stream, foreign_event = bystander.stream, bystander.event
    with raises_at_once(rt, HANDLE):
        rt.sync.synchronize_stream(foreign_stream)
    with raises_at_once(rt, HANDLE):
        rt.events.record_event(foreign_event, 0)
    with raises_at_once(rt, HANDLE):
        rt.streams.destroy_stream(foreign_stream)
    assert (
        daemon_code(rt, npu_pb2.SynchronizeStreamRequest(stream=foreign_stream, timeout_ms=-1))
        == HANDLE
    )
    assert (
        daemon_code(rt, npu_pb2.DestroyStreamRequest(stream=foreign_stream, force=True)) == HANDLE
    )
    assert daemon_code(rt, npu_pb2.DestroyEventRequest(event=foreign_event)) == HANDLE
    assert (
        daemon_code(rt, npu_pb2.SynchronizeEventRequest(event=foreign_event, timeout_ms=-1))
        == HANDLE
    )
    assert daemon_code(rt, npu_pb2.DestroyContextRequest(context=bystander.context)) == HANDLE
    assert daemon_code(rt, npu_pb2.FreeHostRequest(segment=bystander.pinned_handle)) == HANDLE
    default = rt.contexts.stream(0)
    assert deferred_code(rt, commands.RecordEvent.pack(foreign_event, default)) == HANDLE
    assert deferred_code(rt, commands.WaitEvent.pack(foreign_event, default)) == HANDLE
    assert (
        deferred_code(rt, commands.Memset.pack(foreign_stream, dev(bystander.ptr), 0, 64)) == HANDLE
    )


FOREIGN_CLIENT = """
    import sys
    import numpy as np
    from simnpu.client.runtime import Runtime
    rt = Runtime()
    rt.contexts.set_device(0)
    for _ in range(64):
        rt.events.destroy_event(rt.events.create_event())
    data = np.arange(4096, dtype=np.uint8)
    ptr = rt.memory.malloc(4096)
    rt.memory.memcpy(ptr, 4096, data.ctypes.data, 4096, 1)
    stream, event = rt.streams.create_stream(), rt.events.create_event()
    print(stream, event, ptr, flush=True)
    sys.stdin.readline()
    rt.events.record_event(event, stream)
    rt.sync.synchronize_stream(stream)
    out = np.zeros(4096, np.uint8)
    rt.memory.memcpy(out.ctypes.data, 4096, ptr, 4096, 2)
    assert np.array_equal(out, data), "my memory was changed by another client"
    print("intact", flush=True)
"""


def test_handles_and_memory_of_another_client_process(rt, daemon):
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(FOREIGN_CLIENT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
    )
    try:
        line = process.stdout.readline()
        assert line, process.stderr.read()
        stream, event, ptr = map(int, line.split())
        for call in (
            lambda: rt.sync.synchronize_stream(stream),
            lambda: rt.events.record_event(event, 0),
        ):
            with raises_at_once(rt, HANDLE):
                call()
        with raises_at_once(rt, PARAM):
            rt.memory.free(ptr)
        data = host_array(64, 0xEE)
        with raises_at_once(rt, PARAM):
            rt.memory.memcpy(ptr, 64, data.ctypes.data, 64, H2D)
        assert (
            daemon_code(rt, npu_pb2.SynchronizeStreamRequest(stream=stream, timeout_ms=-1))
            == HANDLE
        )
        assert daemon_code(rt, npu_pb2.DestroyStreamRequest(stream=stream, force=True)) == HANDLE
        assert daemon_code(rt, npu_pb2.DestroyEventRequest(event=event)) == HANDLE
        assert daemon_code(rt, npu_pb2.FreeRequest(address=ptr)) == PARAM
        assert (
            daemon_code(rt, npu_pb2.MemsetRequest(dst=on_device(ptr), value=0xEE, count=64))
            == PARAM
        )
        assert (
            deferred_code(rt, commands.Memset.pack(rt.contexts.stream(0), dev(ptr), 0xEE, 64))
            == PARAM
        )
    finally:
        out, err = process.communicate("go\n", timeout=60)
    assert process.returncode == 0, err
    assert out.strip() == "intact"


def test_handles_are_checked_before_anything_is_sent(rt):
    """Async calls with a bad handle raise at the call itself, not at a later synchronize."""
    ptr = rt.memory.malloc(N)
    add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    args = rt.kernels.signature(add).pack(ptr, ptr, ptr, 16)
    for bad in (0x1234, (2 << 40) | 999_999):
        for call, *call_args in (
            (rt.kernels.launch_kernel, add, 1, args, bad),
            (rt.kernels.launch_kernel, bad, 1, args, 0),
            (rt.memory.memset_async, ptr, N, 0, N, bad),
            (rt.memory.memcpy_async, ptr, N, ptr, N, D2D, bad),
            (rt.events.record_event, bad, 0),
            (rt.events.stream_wait_event, 0, bad),
        ):
            with raises_at_once(rt, HANDLE):
                call(*call_args)
    rt.sync.synchronize_stream(0)  # nothing bad was queued
    rt.memory.free(ptr)


# ---- pointers and sizes --------------------------------------------------------------------------
def test_pointers_outside_any_allocation(rt):
    ptr = rt.memory.malloc(N)
    data = host_array()
    nowhere = [
        ptr + 200 * MiB,
        DEVICE_BASE + 255 * MiB,
        DEVICE_BASE + DEVICE_SPAN * 3,
        ptr + N + 4096,
    ]
    for address in nowhere:
        with raises_at_once(rt, PARAM):
            rt.memory.memcpy(address, N, data.ctypes.data, N, H2D)
        with raises_at_once(rt, PARAM):
            rt.memory.memcpy(data.ctypes.data, N, address, N, D2H)
        with raises_at_once(rt, PARAM):
            rt.memory.memset(address, N, 0, N)
        with raises_at_once(rt, PARAM):
            rt.memory.memcpy_async(address, N, ptr, N, D2D, 0)
        assert (
            daemon_code(rt, npu_pb2.MemsetRequest(dst=on_device(address), value=0, count=16))
            == PARAM
        )
        assert (
            deferred_code(rt, commands.Copy.pack(rt.contexts.stream(0), dev(address), dev(ptr), 16))
            == PARAM
        )
    rt.memory.free(ptr)


def test_ranges_running_past_the_end_of_an_allocation(rt):
    ptr = rt.memory.malloc(N)
    data = host_array(2 * N)
    with raises_at_once(rt, PARAM):
        rt.memory.memcpy(ptr, 2 * N, data.ctypes.data, N + 1, H2D)
    with raises_at_once(rt, PARAM):
        rt.memory.memcpy(ptr + 10, N, data.ctypes.data, N - 9, H2D)
    with raises_at_once(rt, PARAM):
        rt.memory.memcpy(data.ctypes.data, 2 * N, ptr + N - 1, 2, D2H)
    with raises_at_once(rt, PARAM):
        rt.memory.memset(ptr + 1, N, 0, N)
    with raises_at_once(rt, PARAM):
        rt.memory.memset_async(ptr, 2 * N, 0, N + 1, 0)
    # the allocator's padding after the requested size is not the caller's either
    assert daemon_code(rt, npu_pb2.MemsetRequest(dst=on_device(ptr), value=0, count=N + 1)) == PARAM
    assert (
        deferred_code(rt, commands.Memset.pack(rt.contexts.stream(0), dev(ptr + N), 0, 1)) == PARAM
    )
    assert (
        deferred_code(rt, commands.Copy.pack(rt.contexts.stream(0), dev(ptr), dev(ptr + 1), N))
        == PARAM
    )
    assert (
        deferred_code(rt, commands.Memset.pack(rt.contexts.stream(0), dev(ptr), 0, (1 << 64) - 1))
        == PARAM
    )
    rt.memory.free(ptr)


def test_negative_counts_sent_to_the_daemon_are_rejected(rt, bystander):
    """A negative count must not mean "to the end of device memory" (numpy's count=-1)."""
    ptr = rt.memory.malloc(N)
    for count in (-1, -N, -(1 << 40)):
        assert (
            daemon_code(rt, npu_pb2.MemsetRequest(dst=on_device(ptr), value=0x66, count=count))
            == PARAM
        )
        assert (
            daemon_code(
                rt,
                npu_pb2.MemcpyRequest(
                    dst=on_device(ptr), src=on_device(ptr + 64), count=count, inline=False
                ),
            )
            == PARAM
        )
        assert (
            daemon_code(
                rt,
                npu_pb2.MemcpyRequest(
                    dst=on_device(ptr), src=staging_at(0), count=count, inline=False
                ),
            )
            == PARAM
        )
    rt.memory.free(ptr)
    bystander.check()


def test_count_greater_than_dest_max(rt):
    ptr = rt.memory.malloc(N)
    data = host_array()
    out = host_array(value=0)
    with raises_at_once(rt, PARAM):
        rt.memory.memcpy(ptr, N - 1, data.ctypes.data, N, H2D)
    with raises_at_once(rt, PARAM):
        rt.memory.memcpy(out.ctypes.data, 16, ptr, 17, D2H)
    with raises_at_once(rt, PARAM):
        rt.memory.memcpy_async(ptr, 0, data.ctypes.data, 1, H2D, 0)
    with raises_at_once(rt, PARAM):
        rt.memory.memset(ptr, 10, 0, 11)
    with raises_at_once(rt, PARAM):
        rt.memory.memcpy(ptr, -1, data.ctypes.data, 0, H2D)
    rt.memory.memcpy(ptr, N, data.ctypes.data, 0, H2D)  # count 0: a successful no-op
    rt.memory.free(ptr)


def test_memcpy_kind_must_match_the_pointers(rt):
    ptr = rt.memory.malloc(N)
    pinned = rt.host.malloc_host(N)
    data = host_array()
    mismatched = [
        (ptr, data.ctypes.data, D2H),
        (ptr, data.ctypes.data, D2D),
        (ptr, data.ctypes.data, H2H),
        (data.ctypes.data, ptr, H2D),
        (data.ctypes.data, ptr, D2D),
        (ptr, ptr, H2D),
        (ptr, ptr, D2H),
        (data.ctypes.data, pinned, H2D),
        (pinned, data.ctypes.data, D2D),
        (pinned, ptr, H2D),
    ]
    for dst, src, kind in mismatched:
        with raises_at_once(rt, PARAM):
            rt.memory.memcpy(dst, N, src, N, kind)
        with raises_at_once(rt, PARAM):
            rt.memory.memcpy_async(dst, N, src, N, kind, 0)
    for kind in (-1, 8, 99):
        with raises_at_once(rt, PARAM):
            rt.memory.memcpy(ptr, N, data.ctypes.data, N, kind)
    rt.memory.memcpy(
        ptr, N, data.ctypes.data, N, codes.ACL_MEMCPY_DEFAULT
    )  # DEFAULT: from the addresses
    rt.host.free_host(pinned)
    rt.memory.free(ptr)


def test_null_pointers(rt):
    ptr = rt.memory.malloc(N)
    data = host_array()
    for call in (
        lambda: rt.memory.memcpy(0, N, data.ctypes.data, N, H2D),
        lambda: rt.memory.memcpy(ptr, N, 0, N, H2D),
        lambda: rt.memory.memcpy(0, N, 0, N, codes.ACL_MEMCPY_DEFAULT),
        lambda: rt.memory.memcpy_async(ptr, N, 0, N, D2D, 0),
        lambda: rt.memory.memset(0, N, 0, N),
        lambda: rt.memory.memset_async(0, N, 0, N, 0),
        lambda: rt.memory.free(0),
        lambda: rt.host.free_host(0),
    ):
        with raises_at_once(rt, NULL):
            call()
    rt.memory.free(ptr)


def test_unknown_memory_spaces_and_host_ranges_at_the_daemon(rt, bystander):
    ptr = rt.memory.malloc(N)
    staging = rt.memory.copies.slot * 2 if rt.memory.uses_shared_memory else None
    for space in (3, 7, 255):
        assert (
            daemon_code(
                rt,
                npu_pb2.MemcpyRequest(
                    dst=on_device(ptr), src=where(space, 0, 0), count=16, inline=False
                ),
            )
            == PARAM
        )
        assert (
            deferred_code(
                rt, commands.Copy.pack(rt.contexts.stream(0), dev(ptr), Location(space, 0, 0), 16)
            )
            == PARAM
        )
    if staging is not None:
        assert (
            daemon_code(
                rt,
                npu_pb2.MemcpyRequest(
                    dst=on_device(ptr), src=staging_at(staging - 8), count=16, inline=False
                ),
            )
            == PARAM
        )
    pinned = rt.host.malloc_host(N)
    handle = rt.host.find(pinned).handle
    here = Location(commands.SPACE_PINNED, handle, N - 8)
    assert deferred_code(rt, commands.Copy.pack(rt.contexts.stream(0), dev(ptr), here, 16)) == PARAM
    theirs = Location(commands.SPACE_PINNED, bystander.pinned_handle, 0)
    assert (
        deferred_code(rt, commands.Copy.pack(rt.contexts.stream(0), theirs, dev(ptr), 16)) == HANDLE
    )
    rt.host.free_host(pinned)
    rt.memory.free(ptr)


# ---- freeing -------------------------------------------------------------------------------------
def test_double_free_and_interior_pointers(rt):
    ptr = rt.memory.malloc(N)
    with raises_at_once(rt, PARAM):
        rt.memory.free(ptr + 64)
    assert daemon_code(rt, npu_pb2.FreeRequest(address=ptr + 64)) == PARAM
    rt.memory.free(ptr)
    with raises_at_once(rt, PARAM):
        rt.memory.free(ptr)
    assert daemon_code(rt, npu_pb2.FreeRequest(address=ptr)) == PARAM
    assert daemon_code(rt, npu_pb2.FreeRequest(address=12345)) == PARAM
    host = rt.host.malloc_host(N)
    with raises_at_once(rt, PARAM):
        rt.host.free_host(host + 8)
    rt.host.free_host(host)
    with raises_at_once(rt, PARAM):
        rt.host.free_host(host)


def test_freeing_another_clients_memory(rt, bystander):
    with raises_at_once(rt, PARAM):
        rt.memory.free(bystander.ptr)
    assert daemon_code(rt, npu_pb2.FreeRequest(address=bystander.ptr)) == PARAM
    with raises_at_once(rt, PARAM):
        rt.host.free_host(bystander.pinned)
    bystander.check()  # its data are intact and it can still free and allocate


def test_copies_into_another_clients_memory_are_refused(rt, bystander):
    ptr = rt.memory.malloc(N)
    stream = rt.contexts.stream(0)
    assert (
        daemon_code(
            rt,
            npu_pb2.MemcpyRequest(
                dst=on_device(bystander.ptr), src=on_device(ptr), count=64, inline=False
            ),
        )
        == PARAM
    )
    assert (
        daemon_code(
            rt,
            npu_pb2.MemcpyRequest(
                dst=on_device(ptr), src=on_device(bystander.ptr), count=64, inline=False
            ),
        )
        == PARAM
    )
    assert deferred_code(rt, commands.Copy.pack(stream, dev(bystander.ptr), dev(ptr), 64)) == PARAM
    assert deferred_code(rt, commands.Memset.pack(stream, dev(bystander.ptr + 128), 0, 64)) == PARAM
    # launch arguments read from another client's memory
    add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    record = commands.LaunchDeviceArgs.pack(1, stream, add, bystander.ptr, 28)
    assert deferred_code(rt, record) == PARAM
    rt.memory.free(ptr)


def test_a_kernel_given_another_clients_memory_faults_alone(rt, bystander):
    """The kernel sees only its own client's allocations: a foreign pointer is a memory
    fault of that task, reported to that client, and the foreign data stay as they were."""
    ptr = rt.memory.malloc(N)
    fill = rt.kernels.get_function(commands.BUILTIN_BINARY, "fill_f32")
    rt.kernels.launch_kernel(fill, 2, rt.kernels.signature(fill).pack(bystander.ptr, 9.0, 1024), 0)
    with pytest.raises(NpuError) as caught:
        rt.sync.synchronize_stream(0)
    assert caught.value.code == codes.ACL_ERROR_RT_DEVICE_MEM_ERROR
    rt.sync.synchronize_stream(0)
    rt.memory.free(ptr)
    bystander.check()


# ---- allocation ----------------------------------------------------------------------------------
def test_malloc_beyond_capacity(rt):
    free_before, total = rt.memory.get_mem_info()
    assert total == 256 * MiB
    for size in (total + 1, 1 << 40, (1 << 62)):
        with pytest.raises(NpuError) as caught:
            rt.memory.malloc(size)
        assert caught.value.code == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
        assert isinstance(caught.value, MemoryError) and isinstance(caught.value, NpuMemoryError)
    assert (
        daemon_code(rt, npu_pb2.MallocRequest(device=0, size=1 << 40, policy=0))
        == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    )
    # after the failures all memory is still there, and a big allocation still succeeds
    assert rt.memory.get_mem_info() == (free_before, total)
    big = rt.memory.malloc(64 * MiB)
    rt.memory.free(big)
    stats = rt.memory.memory_stats()
    assert stats["num_ooms"] >= 4


def test_malloc_size_zero_and_negative(rt):
    for size in (0, -1):
        with raises_at_once(rt, NULL):
            rt.memory.malloc(size)
        assert daemon_code(rt, npu_pb2.MallocRequest(device=0, size=size, policy=0)) == NULL
        with raises_at_once(rt, NULL):
            rt.host.malloc_host(size)
        assert daemon_code(rt, npu_pb2.MallocHostRequest(size=size)) == NULL


def test_pinned_memory_beyond_what_the_host_has(rt, daemon):
    """aclrtMallocHost that cannot be satisfied is an allocation failure; nothing is left
    behind in /dev/shm."""
    before = set(daemon.segments())
    for size in (1 << 62, 1 << 50):
        assert (
            daemon_code(rt, npu_pb2.MallocHostRequest(size=size))
            == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
        )
    assert set(daemon.segments()) == before, os.listdir("/dev/shm")


# ---- kernels ------------------------------------------------------------------------------------
def test_num_blocks_zero(rt):
    ptr = rt.memory.malloc(N)
    add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    args = rt.kernels.signature(add).pack(ptr, ptr, ptr, 16)
    with raises_at_once(rt, PARAM):
        rt.kernels.launch_kernel(add, 0, args, 0)
    args_ptr = ptr + 1024
    to_device(rt, args_ptr, args)
    with raises_at_once(rt, PARAM):
        rt.kernels.launch_kernel_devargs(add, 0, args_ptr, len(args), 0)
    assert deferred_code(rt, commands.Launch.pack(0, rt.contexts.stream(0), add, args)) == PARAM
    assert (
        deferred_code(
            rt, commands.LaunchDeviceArgs.pack(0, rt.contexts.stream(0), add, args_ptr, len(args))
        )
        == PARAM
    )
    rt.memory.free(ptr)


def test_argument_buffer_shorter_than_the_parameters(rt):
    ptr = rt.memory.malloc(N)
    add = rt.kernels.get_function(
        commands.BUILTIN_BINARY, "add_f32"
    )  # ptr, ptr, ptr, u32: 28 bytes
    args = rt.kernels.signature(add).pack(ptr, ptr, ptr, 16)
    for short in (b"", args[:8], args[:27]):
        with raises_at_once(rt, PARAM):
            rt.kernels.launch_kernel(add, 1, short, 0)
        assert (
            deferred_code(rt, commands.Launch.pack(1, rt.contexts.stream(0), add, short)) == PARAM
        )
    to_device(rt, ptr + 1024, args)
    with raises_at_once(rt, PARAM):
        rt.kernels.launch_kernel_devargs(add, 1, ptr + 1024, 27, 0)
    assert (
        deferred_code(
            rt, commands.LaunchDeviceArgs.pack(1, rt.contexts.stream(0), add, ptr + 1024, 27)
        )
        == PARAM
    )
    # arguments in device memory that run past their allocation
    with raises_at_once(rt, PARAM):
        rt.kernels.launch_kernel_devargs(add, 1, ptr + N - 16, 28, 0)
    assert (
        deferred_code(
            rt, commands.LaunchDeviceArgs.pack(1, rt.contexts.stream(0), add, ptr + N - 16, 28)
        )
        == PARAM
    )
    rt.memory.free(ptr)


def test_unknown_kernel_name(rt):
    for name in ("no_such_kernel", "", "add_f32 ", "_block_range", "np"):
        with pytest.raises(NpuError) as caught:
            rt.kernels.get_function(commands.BUILTIN_BINARY, name)
        assert caught.value.code == codes.ACL_ERROR_RT_KERNEL_LOOKUP
    binary = rt.kernels.binary_load("from simnpu import kernel\n@kernel()\ndef a(ctx):\n    pass\n")
    with pytest.raises(NpuError) as caught:
        rt.kernels.get_function(binary, "b")
    assert caught.value.code == codes.ACL_ERROR_RT_KERNEL_LOOKUP
    rt.kernels.binary_unload(binary)


def test_kernel_module_that_does_not_compile(rt):
    for source in ("def broken(:\n", "x = 1\x00\n"):
        with pytest.raises(NpuError) as caught:
            rt.kernels.binary_load(source)
        assert caught.value.code == codes.ACL_ERROR_INVALID_FILE


# ---- devices, contexts, timeouts -----------------------------------------------------------------
def test_invalid_device_id(rt):
    for device in (1, 7, -1, 1 << 40):
        for call in (rt.contexts.set_device, rt.contexts.create_context, rt.contexts.reset_device):
            with raises_at_once(rt, codes.ACL_ERROR_RT_INVALID_DEVICEID):
                call(device)
        for body in (
            npu_pb2.CreateContextRequest(device=device),
            npu_pb2.MallocRequest(device=device, size=64, policy=0),
            npu_pb2.GetMemInfoRequest(device=device),
            npu_pb2.MemoryStatsRequest(device=device),
            npu_pb2.SynchronizeDeviceRequest(device=device, timeout_ms=-1),
        ):
            assert daemon_code(rt, body) == codes.ACL_ERROR_RT_INVALID_DEVICEID, body
    assert rt.contexts.get_device() == 0  # the failed calls changed nothing


def test_no_current_context(daemon, bystander):
    fresh = Runtime(daemon.address)
    try:
        ptr_data = host_array()
        for call in (
            fresh.streams.create_stream,
            fresh.events.create_event,
            lambda: fresh.memory.malloc(64),
            fresh.contexts.get_device,
            fresh.contexts.get_context,
            fresh.memory.get_mem_info,
            lambda: fresh.sync.synchronize_stream(0),
            lambda: fresh.sync.synchronize_device(),
            lambda: fresh.memory.memcpy_async(
                ptr_data.ctypes.data, N, ptr_data.ctypes.data, N, H2H, 0
            ),
        ):
            with raises_at_once(fresh, codes.ACL_ERROR_RT_CONTEXT_NULL):
                call()
        fresh.contexts.set_device(0)

        found = []

        def in_a_new_thread():  # threads inherit no context
            try:
                fresh.streams.create_stream()
            except NpuError as error:
                found.append(error.code)

        thread = threading.Thread(target=in_a_new_thread)
        thread.start()
        thread.join(30)
        assert found == [codes.ACL_ERROR_RT_CONTEXT_NULL]
        round_trip(fresh)
        fresh.contexts.reset_device(0)
        with raises_at_once(fresh, codes.ACL_ERROR_RT_CONTEXT_NULL):
            fresh.streams.create_stream()
    finally:
        fresh.close()
    bystander.check()


def test_timeouts_below_minus_one(rt):
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    rt.events.record_event(event, stream)
    for timeout in (-2, -1000, -(1 << 40)):
        for call, *call_args in (
            (rt.sync.synchronize_stream, stream, timeout),
            (rt.sync.synchronize_event, event, timeout),
            (rt.sync.synchronize_device, timeout),
            (rt.kernels.set_op_execute_timeout, timeout),
        ):
            with pytest.raises(NpuError) as caught:
                call(*call_args)
            assert caught.value.code == PARAM
    rt.sync.synchronize_stream(stream, 0)
    rt.sync.synchronize_event(event, -1)
    rt.events.destroy_event(event)
    rt.streams.destroy_stream(stream)


SLOW = (
    "from simnpu import kernel\nimport time\n@kernel('f64')\ndef nap(ctx, s):\n    time.sleep(s)\n"
)


def test_huge_timeouts_are_accepted_and_harmless(rt, other):
    """A timeout far beyond anything the OS can wait must neither fail nor stop the daemon."""
    nap = rt.kernels.get_function(rt.kernels.binary_load(SLOW), "nap")
    stream = rt.streams.create_stream()
    event = rt.events.create_event()
    for timeout in ((1 << 63) - 1, 1 << 53, 1 << 31):
        rt.kernels.launch_kernel(nap, 1, rt.kernels.signature(nap).pack(0.2), stream)
        rt.events.record_event(event, stream)
        within(30, rt, rt.sync.synchronize_event, event, timeout)
        rt.kernels.launch_kernel(nap, 1, rt.kernels.signature(nap).pack(0.2), stream)
        within(30, rt, rt.sync.synchronize_stream, stream, timeout)
        rt.kernels.launch_kernel(nap, 1, rt.kernels.signature(nap).pack(0.2), stream)
        within(30, rt, rt.sync.synchronize_device, timeout)
    rt.kernels.set_op_execute_timeout((1 << 63) - 1)
    rt.kernels.launch_kernel(nap, 2, rt.kernels.signature(nap).pack(0.2), stream)
    within(30, other, round_trip, other)  # the other client keeps being served meanwhile
    within(30, rt, rt.sync.synchronize_stream, stream, 20_000)
    rt.kernels.set_op_execute_timeout(0)
    rt.events.destroy_event(event)
    rt.streams.destroy_stream(stream)


def test_errors_are_the_last_error(rt):
    rt.devices.get_last_error()
    with pytest.raises(NpuError):
        rt.sync.synchronize_stream(0xBAD)
    assert rt.devices.peek_at_last_error() == HANDLE
    assert rt.devices.get_last_error() == HANDLE
    assert rt.devices.get_last_error() == codes.ACL_SUCCESS


# ---- malformed messages: a hand-made session, no client library ---------------------------------
def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encoded_field(number: int, value: int | bytes) -> bytes:
    """One protobuf field, encoded by hand: a varint for an int, else length-delimited."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def bulk_of(reply) -> bytes:
    """The bulk bytes that came with `reply` (simnpu.proto.bulk), b"" if none."""
    return bytes(getattr(reply, "bulk", b""))


class RawSession:
    """A Session stream driven by hand: any items, replies collected by id."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address, options=service.CHANNEL_OPTIONS)
        self.outgoing: queue.Queue = queue.Queue()
        session = self.channel.stream_stream(
            service.SESSION_METHOD,
            request_serializer=npu_pb2.ClientMessage.SerializeToString,
            response_deserializer=wire.parse_server,
        )
        self.call = session(iter(self.outgoing.get, None))
        self.replies: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.next_id = 1
        hello = self.request(npu_pb2.HelloRequest(pid=0, memory_limit=0, process_name="raw"))
        assert hello.code == 0, hello
        self.session_id = hello.hello.session
        context = self.request(npu_pb2.CreateContextRequest(device=0))
        assert context.code == 0, context
        self.context = context.create_context.context
        self.stream = context.create_context.default_stream

    def _read(self) -> None:
        try:
            for message in self.call:
                # with bulk bytes (the data of its only reply), that reply is a
                # simnpu.proto.bulk.BulkReply whose `bulk` they are
                for reply in message.replies:
                    self.replies.put(reply)
        except grpc.RpcError:
            pass

    def send(self, *items: npu_pb2.Item, bulk: bytes = b"") -> None:
        self.outgoing.put(npu_pb2.ClientMessage(items=items, bulk=bulk))

    def _take_id(self, id: int | None) -> int:
        if id is None:
            id, self.next_id = self.next_id, self.next_id + 1
        return id

    def req(self, body: Message, id: int | None = None, extra: bytes = b"") -> npu_pb2.Item:
        """The Item of a request with `body`; `extra`: encoded fields appended to the Request."""
        request = messages.request(self._take_id(id), 0, body)
        if not extra:
            return npu_pb2.Item(request=request)
        return npu_pb2.Item.FromString(encoded_field(2, request.SerializeToString() + extra))

    def bodiless(self, id: int | None = None, extra: bytes = b"") -> npu_pb2.Item:
        """The Item of a request with no body this daemon knows: none at all, or only `extra`
        (encoded fields Request does not have)."""
        request = npu_pb2.Request(id=self._take_id(id)).SerializeToString() + extra
        return npu_pb2.Item.FromString(encoded_field(2, request))

    def request(self, body: Message, bulk: bytes = b"", extra: bytes = b"") -> npu_pb2.Reply:
        item = self.req(body, extra=extra)
        self.send(item, bulk=bulk)
        return self.reply(item.request.id)

    def reply(self, id: int) -> npu_pb2.Reply:
        reply = self.replies.get(timeout=30)
        assert reply.id == id, f"expected the reply to request {id}, got {reply}"
        return reply

    def sync(self) -> npu_pb2.Reply:
        return self.request(npu_pb2.SynchronizeStreamRequest(stream=self.stream, timeout_ms=-1))

    def close(self) -> None:
        self.outgoing.put(None)
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def raw(daemon, bystander):
    session = RawSession(daemon.address)
    yield session
    assert session.request(npu_pb2.GetMemInfoRequest(device=0)).code == 0, (
        "the raw session itself broke"
    )
    session.close()
    bystander.check()


def malloc(raw: RawSession, size: int) -> int:
    reply = raw.request(npu_pb2.MallocRequest(device=0, size=size, policy=0))
    assert reply.code == 0, reply
    return reply.malloc.address


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xff\xff",
        b"\x00",
        b"\x01",
        b"\x00\x00" + b"\xaa" * 40,
        bytes(range(256)),
        b"\x03\x00" + b"\x01" * 10,
    ],
)
def test_garbage_command_bytes(raw, garbage):
    raw.send(npu_pb2.Item(commands=garbage))
    reply = raw.sync()
    assert reply.code == PARAM, reply
    assert raw.sync().code == 0  # reported once


def test_unknown_command_op_after_good_ones(raw):
    ptr = malloc(raw, N)
    good = commands.Memset.pack(raw.stream, dev(ptr), 0x11, 64)
    raw.send(
        npu_pb2.Item(
            commands=good
            + b"\x63\x00"
            + b"\0" * 30
            + commands.Memset.pack(raw.stream, dev(ptr), 0x22, 64)
        )
    )
    reply = raw.sync()
    assert reply.code == PARAM and "unknown command op 99" in reply.message
    # the record before the bad one ran, the one after it was lost with the rest of the buffer
    read = raw.request(
        npu_pb2.MemcpyRequest(dst=staging_at(0), src=on_device(ptr), count=64, inline=True)
    )
    assert read.code == 0 and bulk_of(read) == b"\x11" * 64


def test_truncated_launch_record(raw):
    ptr = malloc(raw, N)
    record = commands.Launch.pack(1, raw.stream, 0x50000000001, b"\0" * 28)
    for cut in (1, 5, commands.Launch.LAYOUT.size - 1, commands.Launch.LAYOUT.size + 10):
        raw.send(npu_pb2.Item(commands=record[:cut]))
        assert raw.sync().code == PARAM
    add = raw.request(
        npu_pb2.GetFunctionRequest(binary=commands.BUILTIN_BINARY, name="add_f32")
    ).get_function.function
    good = commands.Launch.pack(
        1, raw.stream, add, np.array([ptr, ptr, ptr, 16], np.uint64).tobytes()[:28]
    )
    raw.send(npu_pb2.Item(commands=good + good[:-3]))
    assert raw.sync().code == PARAM
    raw.send(npu_pb2.Item(commands=good))
    assert raw.sync().code == 0


# field numbers Request does not have: in the gaps between its body cases, past them, the largest
UNKNOWN_REQUEST_FIELDS = (3, 4, 49, 59, 66, 73, 999, 2**29 - 1)


def test_requests_without_a_known_body(raw):
    assert not set(UNKNOWN_REQUEST_FIELDS) & set(npu_pb2.Request.DESCRIPTOR.fields_by_number)
    items = [raw.bodiless()]  # no body at all
    for number in UNKNOWN_REQUEST_FIELDS:  # only a field this daemon does not know
        items.append(raw.bodiless(extra=encoded_field(number, 1)))
        items.append(raw.bodiless(extra=encoded_field(number, b"")))
    for item in items:
        raw.send(item)
        reply = raw.reply(item.request.id)
        assert reply.code == PARAM, (item, reply)
        assert "no body this daemon knows" in reply.message, reply


def _request_body_class(case: str) -> type[Message]:
    field = npu_pb2.Request.DESCRIPTOR.fields_by_name[case]
    return message_factory.GetMessageClass(field.message_type)


# every request body case -> the required fields of its body, in order (from the schema)
REQUIRED_FIELDS = {
    field.name: messages.missing(_request_body_class(field.name)())
    for field in npu_pb2.Request.DESCRIPTOR.oneofs_by_name["body"].fields
}
CASES_WITH_REQUIRED_FIELDS = [case for case, required in REQUIRED_FIELDS.items() if required]


def with_fields(body: Message, names, value: int) -> Message:
    """`body` with the fields `names` set: numbers to `value`, bools to true, enums to their
    first value, messages to ones with all their required fields set the same way."""
    for name in names:
        field = body.DESCRIPTOR.fields_by_name[name]
        if field.message_type is not None:
            inner = getattr(body, name)
            inner.SetInParent()
            with_fields(inner, messages.missing(inner), value)
        elif field.type == field.TYPE_BOOL:
            setattr(body, name, True)
        elif field.type == field.TYPE_ENUM:
            setattr(body, name, field.enum_type.values[0].number)
        elif field.type == field.TYPE_STRING:
            setattr(body, name, "x")
        elif field.type == field.TYPE_BYTES:
            setattr(body, name, b"x")
        else:
            setattr(body, name, value)
    return body


@pytest.mark.parametrize("case", CASES_WITH_REQUIRED_FIELDS)
def test_requests_missing_required_fields(raw, case):
    required = REQUIRED_FIELDS[case]
    for present in sorted({0, len(required) - 1}):
        body = with_fields(_request_body_class(case)(), required[:present], raw.stream)
        absent = required[present:]
        assert messages.missing(body) == absent, body
        reply = raw.request(body)
        assert reply.code == PARAM, f"{case} with {present} of {len(required)} fields: {reply}"
        assert f"{case} without {', '.join(absent)}" in reply.message, reply


def without(body: Message, path: str) -> Message:
    """A copy of `body` lacking the field at the dotted `path`."""
    copy = type(body)()
    copy.CopyFrom(body)
    *outer, last = path.split(".")
    target = copy
    for name in outer:
        target = getattr(target, name)
    target.ClearField(last)
    return copy


@pytest.mark.parametrize(
    "gap", ["dst", "src", "count", "dst.space", "dst.offset", "src.space", "src.offset"]
)
def test_memcpy_missing_a_field(raw, gap):
    ptr = malloc(raw, N)
    whole = npu_pb2.MemcpyRequest(
        dst=on_device(ptr), src=on_device(ptr + 64), count=16, inline=False
    )
    assert raw.request(whole).code == 0  # complete, it is a good copy
    reply = raw.request(without(whole, gap))
    assert reply.code == PARAM, reply
    assert f"memcpy without {gap}" in reply.message, reply


def test_memset_missing_a_field(raw):
    ptr = malloc(raw, N)
    whole = npu_pb2.MemsetRequest(dst=on_device(ptr), value=1, count=16)
    assert raw.request(whole).code == 0  # complete, it is a good memset
    for gap in ("dst", "value", "count", "dst.space", "dst.offset"):
        reply = raw.request(without(whole, gap))
        assert reply.code == PARAM, (gap, reply)
        assert f"memset without {gap}" in reply.message, reply


@pytest.mark.parametrize("stream", ["immediate", "stream"])
def test_inline_data_of_the_wrong_length(raw, stream):
    """The bytes of an inline copy to the device are the message's bulk, exactly `count` of
    them (not bytes inside the Request, where the old wire's Request.data was), whether they
    go straight to device memory or through staging."""
    ptr = malloc(raw, N)
    body = npu_pb2.MemcpyRequest(dst=on_device(ptr), src=staging_at(0), count=16, inline=True)
    if stream == "stream":
        body.stream = raw.stream  # else synchronous: no stream
    for bulk in (b"", b"x" * 15, b"x" * 17, b"x" * 4096):
        assert raw.request(body, bulk=bulk).code == PARAM
    assert 4 not in npu_pb2.Request.DESCRIPTOR.fields_by_number
    assert raw.request(body, extra=encoded_field(4, b"x" * 16)).code == PARAM
    # one chunk per message: a second inline copy in it finds no bytes left
    first, second = raw.req(body), raw.req(body)
    raw.send(first, second, bulk=b"w" * 16)
    codes_by_id = {r.id: r.code for r in (raw.replies.get(timeout=30), raw.replies.get(timeout=30))}
    # (a copy on a stream answers once it has run: after the failed second one)
    assert codes_by_id == {first.request.id: 0, second.request.id: PARAM}
    reply = raw.request(body, bulk=b"y" * 16)
    assert reply.code == 0
    read = raw.request(
        npu_pb2.MemcpyRequest(dst=staging_at(0), src=on_device(ptr), count=16, inline=True)
    )
    assert bulk_of(read) == b"y" * 16


def test_requests_before_hello_and_hello_twice(daemon, bystander):
    session = RawSession.__new__(RawSession)
    session.channel = grpc.insecure_channel(daemon.address, options=service.CHANNEL_OPTIONS)
    session.outgoing = queue.Queue()
    stub = session.channel.stream_stream(
        service.SESSION_METHOD,
        request_serializer=npu_pb2.ClientMessage.SerializeToString,
        response_deserializer=wire.parse_server,
    )
    session.call = stub(iter(session.outgoing.get, None))
    session.replies = queue.Queue()
    session.reader = threading.Thread(target=session._read, daemon=True)
    session.reader.start()
    session.next_id = 1
    try:
        context = session.request(npu_pb2.CreateContextRequest(device=0))
        assert context.code == 0
        ptr = malloc(session, N)
        # no staging area yet: staging locations are unknown
        reply = session.request(
            npu_pb2.MemcpyRequest(dst=on_device(ptr), src=staging_at(0), count=16, inline=True),
            bulk=b"z" * 16,
        )
        assert reply.code == PARAM
        for _ in range(2):
            hello = session.request(
                npu_pb2.HelloRequest(pid=1, memory_limit=0, process_name="twice")
            )
            assert hello.code == 0
        # every field of a HelloRequest may be left out
        assert session.request(npu_pb2.HelloRequest()).code == 0
    finally:
        session.close()
    bystander.check()


def test_failed_requests_with_id_zero_get_no_reply(raw):
    raw.send(
        raw.req(npu_pb2.FreeRequest(address=12345), id=0),
        raw.bodiless(id=0),
        raw.bodiless(id=0, extra=encoded_field(999, 1)),
    )
    reply = raw.request(npu_pb2.GetMemInfoRequest(device=0))
    assert reply.code == 0  # the first reply that arrives is this one's


def test_many_bad_items_in_one_message(raw):
    ptr = malloc(raw, N)
    items = [
        npu_pb2.Item(commands=b"\xff"),
        raw.req(npu_pb2.FreeRequest(address=1)),
        raw.req(npu_pb2.MallocRequest()),
        npu_pb2.Item(commands=commands.Memset.pack(raw.stream, dev(ptr), 0x33, 16)),
        raw.req(npu_pb2.SynchronizeStreamRequest(stream=raw.stream, timeout_ms=-1)),
        raw.req(
            npu_pb2.MemcpyRequest(
                dst=staging_at(0), src=on_device(ptr), count=16, stream=raw.stream, inline=True
            )
        ),
    ]
    raw.send(*items)
    replies = [raw.reply(item.request.id) for item in items if item.HasField("request")]
    assert [reply.code for reply in replies] == [PARAM, PARAM, PARAM, 0]  # the sync: the garbage
    assert bulk_of(replies[3]) == b"\x33" * 16  # the good memset ran, in order


def test_non_protobuf_bytes_on_the_session_stream(daemon, bystander):
    channel = grpc.insecure_channel(daemon.address)
    try:
        session = channel.stream_stream(
            service.SESSION_METHOD,
            request_serializer=lambda b: b,
            response_deserializer=wire.parse_server,
        )
        answer = list(session(iter([b"\xff\xff"]), timeout=30))  # refused, not left hanging
        assert [notice.kind for message in answer for notice in message.notices] == [
            npu_pb2.Notice.KIND_DEVICE_GONE
        ]
        query = channel.unary_unary(
            service.QUERY_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as caught:
            query(b"\xff\xff\xff", timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        missing = channel.unary_unary("/simnpu.v1.Npu/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as caught:
            missing(b"", timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        channel.close()
    bystander.check()


def test_a_new_client_process_works_after_all_this(daemon):
    result = run_client(
        daemon.address,
        """
        import numpy as np
        import simnpu.client as npu
        with npu.Device(0):
            x = npu.DeviceBuffer.from_array(np.arange(1000, dtype=np.float32))
            y = npu.DeviceBuffer(4000)
            stream = npu.Stream()
            npu.builtin("relu_f32").launch(2, x, y, 1000, stream=stream)
            stream.synchronize()
            assert np.array_equal(y.to_numpy(np.float32), np.arange(1000, dtype=np.float32))
        print("ok")
    """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
