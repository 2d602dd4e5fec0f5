"""What orders synchronous copies and memsets, and aclrtMemsetD32Async on pinned memory,
through `acl` against a real daemon.

aclrtMemcpy and aclrtMemset are not ordered with any stream (the runtime copies through
the driver outside every stream): a kernel still queued when they run has not written its
memory yet. The tests hold the kernel behind a gate kernel, so the copy always runs first
(no timing), and SIMNPU_CHECK=racecheck reports the race. aclrtMemsetD32Async on pinned
memory is a task of its stream."""

from __future__ import annotations

import struct

from conftest import GATE, run_client

SLOW_WRITE = (
    GATE
    + """

@kernel("ptr", "i32")
def write_value(ctx, out, value):
    ctx.gm(out, "int32", 1, access="w")[0] = value
"""
)

# A pyACL program: a kernel that writes 123 into A is queued behind a closed gate, then A is
# copied (aclrtMemcpy) to B, or set (aclrtMemset), before anything synchronizes.
UNSYNCHRONIZED = f"""
import struct
import acl

SOURCE = {SLOW_WRITE!r}
call = sys.argv[1]
assert acl.init() == 0 and acl.rt.set_device(0) == 0
stream, ret = acl.rt.create_stream()
binary, ret = acl.rt.binary_load_from_data(SOURCE, None)
gate, ret = acl.rt.binary_get_function(binary, "gate")
write, ret = acl.rt.binary_get_function(binary, "write_value")
flag, ret = acl.rt.malloc(64, 0)
a, ret = acl.rt.malloc(64, 0)
b, ret = acl.rt.malloc(64, 0)
zero = bytes(64)
for ptr in (flag, a, b):
    assert acl.rt.memcpy(ptr, 64, acl.util.bytes_to_ptr(zero), 64, 1) == 0

def launch(function, fmt, *values):
    args = struct.pack(fmt, *values)
    ptr = acl.util.bytes_to_ptr(args)
    assert acl.rt.launch_kernel_with_host_args(function, 1, stream, None, ptr, len(args)) == 0

launch(gate, "<Qd", flag, 60.0)
launch(write, "<Qi", a, 123)
if call == "memcpy":
    assert acl.rt.memcpy(b, 64, a, 64, acl.ACL_MEMCPY_DEVICE_TO_DEVICE) == 0
else:
    assert acl.rt.memset(a, 64, 0x11, 64) == 0
one = struct.pack("<i", 1)
assert acl.rt.memcpy(flag, 4, acl.util.bytes_to_ptr(one), 4, 1) == 0  # open the gate
assert acl.rt.synchronize_stream(stream) == 0
out = bytes(8)
assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), 8, a, 8, 2) == 0
print("A", struct.unpack("<ii", out))
assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), 8, b, 8, 2) == 0
print("B", struct.unpack("<ii", out))
for ptr in (flag, a, b):
    assert acl.rt.free(ptr) == 0
assert acl.rt.destroy_stream(stream) == 0
assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
"""


def _unsynchronized(daemon, tmp_path, call: str) -> tuple[str, str]:
    report = tmp_path / "report.txt"
    result = run_client(
        daemon.address,
        UNSYNCHRONIZED.replace("sys.argv[1]", repr(call)),
        env={"SIMNPU_CHECK": "racecheck", "SIMNPU_CHECK_REPORT": str(report)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, report.read_text()


def test_a_sync_copy_is_not_ordered_after_a_queued_kernel_and_racecheck_says_so(daemon, tmp_path):
    out, report = _unsynchronized(daemon, tmp_path, "memcpy")
    assert "A (123, 0)" in out  # the kernel ran, after the copy
    assert "B (0, 0)" in out  # the copy ran before it: B has A's old bytes
    assert "WARNING racecheck: data race" in report, report
    assert "kernel write_value" in report and "memcpy D2D" in report, report


def test_a_sync_memset_is_not_ordered_after_a_queued_kernel_and_racecheck_says_so(daemon, tmp_path):
    out, report = _unsynchronized(daemon, tmp_path, "memset")
    assert "A (123, 286331153)" in out  # the memset first, then the kernel's word
    assert "WARNING racecheck: data race" in report, report
    assert "kernel write_value" in report and "memset" in report, report


def _hold(acl, stream: int) -> tuple[int, int]:
    """Queue a gate kernel on `stream`: it holds the stream until `_open(acl, flag)`.
    Returns (flag, binary)."""
    binary, _ = acl.rt.binary_load_from_data(GATE, None)
    gate, _ = acl.rt.binary_get_function(binary, "gate")
    flag, _ = acl.rt.malloc(64, 0)
    zero = bytes(4)
    assert acl.rt.memcpy(flag, 4, acl.util.bytes_to_ptr(zero), 4, 1) == 0
    args = struct.pack("<Qd", flag, 60.0)
    ptr = acl.util.bytes_to_ptr(args)
    assert acl.rt.launch_kernel_with_host_args(gate, 1, stream, None, ptr, len(args)) == 0
    return flag, binary


def _open(acl, flag: int, binary: int) -> None:
    one = struct.pack("<i", 1)
    assert acl.rt.memcpy(flag, 4, acl.util.bytes_to_ptr(one), 4, 1) == 0


def _release(acl, flag: int, binary: int) -> None:
    assert acl.rt.free(flag) == 0
    assert acl.rt.binary_unload(binary) == 0


def words(acl, ptr: int, count: int) -> list[int]:
    return list(struct.unpack(f"<{count}I", acl.util.ptr_to_bytes(ptr, 4 * count)))


def test_memset_d32_async_on_pinned_memory_waits_for_its_stream(acl):
    stream, _ = acl.rt.create_stream()
    pinned, _ = acl.rt.malloc_host(64)
    assert acl.rt.memset_d32(pinned, 64, 5, 16) == 0  # the synchronous form: at once
    assert words(acl, pinned, 16) == [5] * 16
    for _ in range(3):  # the stream is held every time: the order does not depend on timing
        flag, binary = _hold(acl, stream)
        assert acl.rt.memset_d32_async(pinned + 8, 56, 0xCAFEF00D, 4, stream) == 0
        assert words(acl, pinned, 16) == [5] * 16  # queued behind the gate, not done yet
        _open(acl, flag, binary)
        assert acl.rt.synchronize_stream(stream) == 0
        assert words(acl, pinned, 16) == [5] * 2 + [0xCAFEF00D] * 4 + [5] * 10
        _release(acl, flag, binary)
        assert acl.rt.memset_d32(pinned, 64, 5, 16) == 0


def test_memset_d32_async_on_pinned_memory_follows_the_copy_before_it(acl):
    """A device-to-pinned copy then a fill of the same words, on one stream: the fill wins."""
    stream, _ = acl.rt.create_stream()
    pinned, _ = acl.rt.malloc_host(64)
    device, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memset_d32(device, 64, 9, 16) == 0
    flag, binary = _hold(acl, stream)
    assert acl.rt.memcpy_async(pinned, 64, device, 64, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream) == 0
    assert acl.rt.memset_d32_async(pinned, 64, 1, 8, stream) == 0
    _open(acl, flag, binary)
    assert acl.rt.synchronize_stream(stream) == 0
    assert words(acl, pinned, 16) == [1] * 8 + [9] * 8
    _release(acl, flag, binary)
    assert acl.rt.free(device) == 0
    assert acl.rt.free_host(pinned) == 0
    assert acl.rt.destroy_stream(stream) == 0


def test_memset_d32_bad_input(acl):
    stream, _ = acl.rt.create_stream()
    pinned, _ = acl.rt.malloc_host(64)
    pageable = bytearray(64)
    address = acl.util.bytes_to_ptr(bytes(pageable))
    for call in (acl.rt.memset_d32, acl.rt.memset_d32_async):
        extra = (stream,) if call is acl.rt.memset_d32_async else ()
        assert call(address, 64, 1, 4, *extra) == acl.ACL_ERROR_INVALID_PARAM  # not ACL memory
        assert "aclrtMalloc or aclrtMallocHost" in acl.get_recent_err_msg()
        assert call(0, 64, 1, 4, *extra) == acl.ACL_ERROR_INVALID_PARAM
        assert call(pinned + 2, 60, 1, 4, *extra) == acl.ACL_ERROR_INVALID_PARAM  # unaligned
        assert call(pinned, 12, 1, 4, *extra) == acl.ACL_ERROR_INVALID_PARAM  # N * 4 > memSize
        assert call(pinned, 128, 1, 32, *extra) == acl.ACL_ERROR_RT_PARAM_INVALID  # past the end
        assert call(pinned, 64, 1, 0, *extra) == 0  # nothing to do
    assert acl.rt.memset_d32_async(pinned, 64, 1, 4, 0xBAD) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert words(acl, pinned, 16) == [0] * 16  # nothing above wrote
    assert acl.rt.synchronize_stream(stream) == 0


def test_pinned_memory_freed_before_its_fill_ran_fails_the_stream_only(acl):
    stream, _ = acl.rt.create_stream()
    pinned, _ = acl.rt.malloc_host(64)
    flag, binary = _hold(acl, stream)
    assert acl.rt.memset_d32_async(pinned, 64, 7, 16, stream) == 0
    assert acl.rt.free_host(pinned) == 0  # before the stream gets there
    _open(acl, flag, binary)
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_DEVICE_MEM_ERROR
    assert "freed before the task ran" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(stream) == 0  # the stream goes on
    other, _ = acl.rt.malloc_host(64)  # and the session, and the daemon
    assert acl.rt.memset_d32_async(other, 64, 3, 16, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert words(acl, other, 16) == [3] * 16
    _release(acl, flag, binary)
    assert acl.rt.free_host(other) == 0
    assert acl.rt.destroy_stream(stream) == 0
