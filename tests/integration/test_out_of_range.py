"""Values no wire field can carry (sizes past int64, a numBlocks past 32 bits, arguments too
big for the submission ring) get their ACL code at once and leave no trace: no sequence
number is taken, so the client stays in step with the daemon, and a stream synchronize
right after still succeeds on the completion signal, a timeout to spare."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import round_trip

from simnpu.client.runtime import Runtime
from simnpu.proto import codes, commands
from simnpu.proto.errors import NpuError

PARAM = codes.ACL_ERROR_RT_PARAM_INVALID
NULL = codes.ACL_ERROR_INVALID_PARAM
OOM = codes.ACL_ERROR_RT_MEMORY_ALLOCATION
BIG = 1 << 63  # one past int64
N = 4096


@pytest.fixture
def rt(daemon):
    """A raw Runtime of the module's daemon (device 0 set); afterwards it still works."""
    made = Runtime(daemon.address)
    made.contexts.set_device(0)
    yield made
    round_trip(made)
    made.close()


def in_step(rt: Runtime) -> None:
    """A launch, then a synchronize with a timeout that succeeds (a client a number ahead of
    the daemon would wait the timeout out and get 507046), with the kernel's result."""
    a = np.arange(N, dtype=np.float32)
    ptrs = [rt.memory.malloc(a.nbytes) for _ in range(2)]
    stream = rt.streams.create_stream()
    rt.memory.memcpy(ptrs[0], a.nbytes, a.ctypes.data, a.nbytes, codes.ACL_MEMCPY_HOST_TO_DEVICE)
    add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    rt.kernels.launch_kernel(
        add, 2, rt.kernels.signature(add).pack(ptrs[0], ptrs[0], ptrs[1], N), stream
    )
    rt.sync.synchronize_stream(stream, 10_000)
    out = np.zeros_like(a)
    rt.memory.memcpy(
        out.ctypes.data, out.nbytes, ptrs[1], out.nbytes, codes.ACL_MEMCPY_DEVICE_TO_HOST
    )
    assert np.array_equal(out, a + a)
    rt.streams.destroy_stream(stream)
    for ptr in ptrs:
        rt.memory.free(ptr)


def within(seconds: float, call, *args):
    """`call(*args)`'s result or exception; fails the test if it has not returned in time."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((call(*args), None))
        except Exception as error:  # noqa: BLE001  (handed to the test's thread)
            outcome.append((None, error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{getattr(call, '__name__', call)} did not return within {seconds} s"
    return outcome[0]


def test_acl_malloc_of_sizes_past_int64(acl):
    """aclrtMalloc as CANN answers it: ACL's own overflow check for a size that wraps once
    aligned and padded (100000), the driver's refusal for any other (207001)."""
    from simnpu.client import facade

    log = facade.session().connection.log
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    for size, code in ((BIG, OOM), ((1 << 64) - 1, NULL), ((1 << 64) - 64, NULL)):
        before = log.seq
        assert acl.rt.malloc(size, 0) == (0, code)
        assert str(size) in acl.get_recent_err_msg()
        assert log.seq == before, "the refused call took a sequence number"
    before = log.seq
    assert acl.rt.malloc_host(BIG) == (0, OOM)
    assert log.seq == before
    ptr, ret = acl.rt.malloc(N, 0)
    assert ret == 0
    add = facade.session().kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    args = facade.session().kernels.signature(add).pack(ptr, ptr, ptr, 16)
    facade.session().kernels.launch_kernel(add, 1, args, stream)
    assert acl.rt.synchronize_stream_with_timeout(stream, 10_000) == 0
    assert acl.rt.free(ptr) == 0
    assert acl.rt.destroy_stream(stream) == 0


def _pool_malloc(rt: Runtime) -> None:
    pool = rt.memory.mem_pool_create()
    try:
        rt.memory.mem_pool_malloc_async(BIG, pool, 0)
    finally:
        rt.memory.mem_pool_destroy(pool)


def _pool_attr(rt: Runtime) -> None:
    pool = rt.memory.mem_pool_create()
    try:
        rt.memory.mem_pool_set_attr(pool, BIG, 0)
    finally:
        rt.memory.mem_pool_destroy(pool)


def _launch(rt: Runtime) -> None:
    add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    ptr = rt.memory.malloc(N)
    try:
        rt.kernels.launch_kernel(add, 1 << 32, rt.kernels.signature(add).pack(ptr, ptr, ptr, 16), 0)
    finally:
        rt.memory.free(ptr)


CASES = {
    "malloc 2**63": (lambda rt: rt.memory.malloc(BIG), OOM),
    "malloc 2**64-1": (lambda rt: rt.memory.malloc((1 << 64) - 1), NULL),
    "malloc 2**64": (lambda rt: rt.memory.malloc(1 << 64), PARAM),
    "malloc policy": (lambda rt: rt.memory.malloc(N, BIG), PARAM),
    "malloc_host 2**63": (lambda rt: rt.host.malloc_host(BIG), OOM),
    "malloc_host 2**64": (lambda rt: rt.host.malloc_host(1 << 64), PARAM),
    "pool malloc 2**63": (_pool_malloc, OOM),
    "pool attr": (_pool_attr, PARAM),
    "pool max size": (lambda rt: rt.memory.mem_pool_create(BIG), PARAM),
    "memory limit": (lambda rt: rt.memory.set_memory_limit(BIG), PARAM),
    "stream priority": (lambda rt: rt.streams.create_stream(BIG), PARAM),
    "stream flags": (lambda rt: rt.streams.create_stream(0, BIG), PARAM),
    "event flags": (lambda rt: rt.events.create_event(BIG), PARAM),
    "failure mode": (lambda rt: rt.streams.set_stream_failure_mode(0, BIG), PARAM),
    "stream timeout": (lambda rt: rt.sync.synchronize_stream(0, BIG), PARAM),
    "device timeout": (lambda rt: rt.sync.synchronize_device(-BIG - 1), PARAM),
    "op timeout": (lambda rt: rt.kernels.set_op_execute_timeout(BIG), PARAM),
    "launch numBlocks 2**32": (_launch, PARAM),
}


@pytest.mark.parametrize("case", list(CASES))
def test_raw_layer_refuses_what_the_wire_cannot_carry(rt, case):
    call, code = CASES[case]
    with pytest.raises(NpuError) as caught:
        call(rt)
    assert caught.value.code == code, caught.value
    in_step(rt)


def test_values_out_of_range_take_no_sequence_number(rt):
    log = rt.connection.log
    for case in ("malloc 2**63", "malloc_host 2**63", "stream timeout", "event flags"):
        before = log.seq
        with pytest.raises(NpuError):
            CASES[case][0](rt)
        assert log.seq == before, f"{case}: the refused call took a sequence number"
    in_step(rt)


def test_launch_arguments_longer_than_the_ring(rt):
    """Bytes past the kernel's parameters are not sent (the daemon never reads them): a
    5 MiB argument buffer, more than the whole submission ring, launches like a short one."""
    a = np.arange(N, dtype=np.float32)
    ptr = rt.memory.malloc(a.nbytes)
    rt.memory.memcpy(ptr, a.nbytes, a.ctypes.data, a.nbytes, codes.ACL_MEMCPY_HOST_TO_DEVICE)
    add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    stream = rt.streams.create_stream()
    args = rt.kernels.signature(add).pack(ptr, ptr, ptr, N) + bytes(5 << 20)
    _, error = within(30, rt.kernels.launch_kernel, add, 2, args, stream)
    assert error is None, error
    rt.sync.synchronize_stream(stream, 10_000)
    out = np.zeros_like(a)
    rt.memory.memcpy(out.ctypes.data, out.nbytes, ptr, out.nbytes, codes.ACL_MEMCPY_DEVICE_TO_HOST)
    assert np.array_equal(out, a + a)
    rt.streams.destroy_stream(stream)
    rt.memory.free(ptr)


def test_a_record_too_big_for_the_ring_is_refused_before_it_is_numbered(rt):
    if rt.connection.ring is None:
        pytest.skip("this client has no submission ring")
    add = rt.kernels.get_function(commands.BUILTIN_BINARY, "add_f32")
    stream = rt.contexts.stream(0)
    record = commands.Launch.pack(1, stream, add, bytes(5 << 20))
    before = rt.connection.log.seq
    _, error = within(30, rt.connection.send_command, record, "test", stream)
    assert isinstance(error, NpuError) and error.code == PARAM, error
    assert rt.connection.log.seq == before
    in_step(rt)
