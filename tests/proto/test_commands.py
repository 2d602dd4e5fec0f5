"""Packed command records: every op round-trips; a bad record stops decoding with 107000
after the records before it were yielded."""

import struct

import pytest

from simnpu.proto import codes, commands
from simnpu.proto.commands import Location
from simnpu.proto.errors import NpuError

U64 = (1 << 64) - 1
U32 = (1 << 32) - 1

DEV = Location(commands.SPACE_DEVICE, 0, (1 << 47) + 4096)
PIN = Location(commands.SPACE_PINNED, (6 << 40) | 3, 17)
STAGE = Location(commands.SPACE_STAGING, 0, 1 << 22)

# (packed record, what decode must yield) for every op, with edge values in the fields
CASES = {
    "launch": (
        commands.Launch.pack(3, 0x20000000001, 0x50000000002, b"\x01\x02\x03\x04\x05"),
        commands.Launch(3, 0x20000000001, 0x50000000002, b"\x01\x02\x03\x04\x05"),
    ),
    "launch, no args": (commands.Launch.pack(1, 7, 9, b""), commands.Launch(1, 7, 9, b"")),
    "launch, max fields": (
        commands.Launch.pack(U32, U64, U64, bytes(range(256)) * 3),
        commands.Launch(U32, U64, U64, bytes(range(256)) * 3),
    ),
    "launch devargs": (
        commands.LaunchDeviceArgs.pack(48, 2, 5, (1 << 47) + 64, 24),
        commands.LaunchDeviceArgs(48, 2, 5, (1 << 47) + 64, 24),
    ),
    "launch with config": (
        commands.LaunchWithConfig.pack(8, 2, 5, U64, b"\x01" * 24, [(8, b"\x02" * 4), (16, b"")]),
        commands.LaunchWithConfig(8, 2, 5, U64, b"\x01" * 24, ((8, b"\x02" * 4), (16, b""))),
    ),
    "launch with config, no place holders": (
        commands.LaunchWithConfig.pack(1, 7, 9, 0, b"", []),
        commands.LaunchWithConfig(1, 7, 9, 0, b"", ()),
    ),
    "copy pinned -> device": (
        commands.Copy.pack(11, DEV, PIN, 4097),
        commands.Copy(11, DEV, PIN, 4097),
    ),
    "copy device -> staging": (
        commands.Copy.pack(U64, STAGE, DEV, U64),
        commands.Copy(U64, STAGE, DEV, U64),
    ),
    "memset": (
        commands.Memset.pack(12, DEV, 0xAB, 3 << 20),
        commands.Memset(12, DEV, 0xAB, 3 << 20),
    ),
    "memset d32": (
        commands.MemsetD32.pack(12, PIN, 0xDEADBEEF, 3 << 20),
        commands.MemsetD32(12, PIN, 0xDEADBEEF, 3 << 20),
    ),
    "record event": (
        commands.RecordEvent.pack(0x30000000001, 2),
        commands.RecordEvent(0x30000000001, 2),
    ),
    "reset event": (
        commands.ResetEvent.pack(4, 5),
        commands.ResetEvent(4, 5),
    ),
    "wait event": (
        commands.WaitEvent.pack(U64, U64),
        commands.WaitEvent(U64, U64),
    ),
    "wait event with a timeout": (
        commands.WaitEventTimeout.pack(U64, U64, 0xFFFFFFFF),
        commands.WaitEventTimeout(U64, U64, 0xFFFFFFFF),
    ),
    "thread-limited launch": (
        commands.ThreadLimited.pack(U64, commands.Launch.pack(3, 7, 9, b"\x01\x02")),
        commands.ThreadLimited(U64, commands.Launch(3, 7, 9, b"\x01\x02")),
    ),
    "record notify": (
        commands.RecordNotify.pack(0x2D0000000001, 3),
        commands.RecordNotify(0x2D0000000001, 3),
    ),
    "wait notify": (
        commands.WaitNotify.pack(U64, U64, 0xFFFFFFFF),
        commands.WaitNotify(U64, U64, 0xFFFFFFFF),
    ),
    "value write": (
        commands.ValueWrite.pack(U64, U64, 0, 7),
        commands.ValueWrite(U64, U64, 0, 7),
    ),
    "value wait": (
        commands.ValueWait.pack(1 << 47, U64, 3, U64),
        commands.ValueWait(1 << 47, U64, 3, U64),
    ),
    "count notify record": (
        commands.CntNotifyRecord.pack(U64, 5, 4, 0xFFFFFFFF),
        commands.CntNotifyRecord(U64, 5, 4, 0xFFFFFFFF),
    ),
    "count notify wait": (
        commands.CntNotifyWait.pack(U64, U64, 4, 0xFFFFFFFF, 0xFFFFFFFF, 1),
        commands.CntNotifyWait(U64, U64, 4, 0xFFFFFFFF, 0xFFFFFFFF, 1),
    ),
    "reduce": (
        commands.Reduce.pack(U64, U64, 8, U64, 12, -1),
        commands.Reduce(U64, U64, 8, U64, 12, -1),
    ),
    "random numbers": (
        commands.RandomNum.pack(
            U64,
            27,
            3,
            U64,
            16,
            ((1, b"\xff" * 8, 8), (0, b"12345678", 2)),
            (0, b"\0" * 8, 8),
            (1, b"abcdefgh", 255),
        ),
        commands.RandomNum(
            U64,
            27,
            3,
            U64,
            16,
            ((1, b"\xff" * 8, 8), (0, b"12345678", 2)),
            (0, b"\0" * 8, 8),
            (1, b"abcdefgh", 255),
        ),
    ),
    "model replay": (
        commands.ReplayModel.pack(U64, 7),
        commands.ReplayModel(U64, 7),
    ),
    "host callback": (
        commands.HostCallback.pack(2, 99, True),
        commands.HostCallback(2, 99, True),
    ),
    "host done": (
        commands.HostDone.pack(2, 99, False),
        commands.HostDone(2, 99, False),
    ),
    "collective": (
        commands.Collective.pack(
            U64, (16 << 40) | 1, 2, DEV.offset, DEV.offset + 64, U64, 7, 4, 11, 3, U32
        ),
        commands.Collective(
            U64, (16 << 40) | 1, 2, DEV.offset, DEV.offset + 64, U64, 7, 4, 11, 3, U32
        ),
    ),
}


def decode_all(buffer):
    return list(commands.decode(buffer))


def decode_until_error(buffer):
    """(records yielded, the NpuError that stopped decoding)."""
    got: list = []
    with pytest.raises(NpuError) as caught:
        got.extend(commands.decode(buffer))  # appends each record as it comes
    return got, caught.value


@pytest.mark.parametrize("name", CASES)
def test_every_command_round_trips(name):
    packed, expected = CASES[name]
    assert decode_all(packed) == [expected]
    assert type(decode_all(packed)[0]) is type(expected)


def test_every_op_is_covered():
    ops = {struct.unpack_from("<H", packed)[0] for packed, _ in CASES.values()}
    assert ops == {kind.OP for kind in commands._KINDS}


def test_records_back_to_back_decode_in_order():
    packed = b"".join(p for p, _ in CASES.values())
    assert decode_all(packed) == [e for _, e in CASES.values()]


def test_empty_buffer_yields_nothing():
    assert decode_all(b"") == []


def test_bytes_like_buffers_decode():
    packed, expected = CASES["launch"]
    assert decode_all(bytearray(packed)) == [expected]
    assert decode_all(memoryview(packed)) == [expected]


def test_launch_args_are_bytes_not_views_of_the_buffer():
    packed, _ = CASES["launch"]
    buffer = bytearray(packed)
    (launch,) = decode_all(buffer)
    buffer[-1] ^= 0xFF
    assert launch.args == b"\x01\x02\x03\x04\x05"


def test_packed_sizes_match_the_layouts():
    assert len(commands.Launch.pack(1, 2, 3, b"abc")) == commands.Launch.LAYOUT.size + 3
    assert (
        len(commands.LaunchDeviceArgs.pack(1, 2, 3, 4, 5)) == commands.LaunchDeviceArgs.LAYOUT.size
    )
    assert len(commands.Copy.pack(1, DEV, PIN, 5)) == commands.Copy.LAYOUT.size
    assert len(commands.Memset.pack(1, DEV, 0, 5)) == commands.Memset.LAYOUT.size
    assert len(commands.RecordEvent.pack(1, 2)) == commands.RecordEvent.LAYOUT.size


GOOD = [CASES["record event"], CASES["memset"]]
GOOD_BYTES = b"".join(p for p, _ in GOOD)
GOOD_RECORDS = [e for _, e in GOOD]


@pytest.mark.parametrize("name", CASES)
def test_truncated_record_raises_107000_after_the_records_before_it(name):
    packed, _ = CASES[name]
    for cut in sorted({1, 2, len(packed) // 2, len(packed) - 1}):
        got, error = decode_until_error(GOOD_BYTES + packed[:cut])
        assert got == GOOD_RECORDS
        assert error.code == codes.ACL_ERROR_RT_PARAM_INVALID
        assert "truncated" in error.message


def test_launch_whose_args_length_runs_past_the_buffer():
    record = commands.Launch.LAYOUT.pack(commands.Launch.OP, 1, 2, 3, 100) + b"\0" * 99
    got, error = decode_until_error(GOOD_BYTES + record)
    assert got == GOOD_RECORDS
    assert error.code == codes.ACL_ERROR_RT_PARAM_INVALID
    assert "launch arguments truncated" in error.message


def test_launch_with_a_huge_args_length():
    record = commands.Launch.LAYOUT.pack(commands.Launch.OP, 1, 2, 3, U32)
    got, error = decode_until_error(record)
    assert got == [] and error.code == codes.ACL_ERROR_RT_PARAM_INVALID


@pytest.mark.parametrize("op", [0, 10, 0x7FFF, 0xFFFF])
def test_unknown_op_raises_107000_after_the_records_before_it(op):
    tail = struct.pack("<H", op) + b"\0" * 64 + GOOD_BYTES
    got, error = decode_until_error(GOOD_BYTES + tail)
    assert got == GOOD_RECORDS
    assert error.code == codes.ACL_ERROR_RT_PARAM_INVALID
    assert f"unknown command op {op}" in error.message


def test_garbage_bytes_raise_107000():
    got, error = decode_until_error(b"\xff\xfe\xfd garbage")
    assert got == [] and error.code == codes.ACL_ERROR_RT_PARAM_INVALID


def test_decode_is_lazy():
    """The records before a bad one are yielded before the error: the daemon executes them."""
    decoder = commands.decode(GOOD_BYTES + b"\xff\xff")
    assert next(decoder) == GOOD_RECORDS[0]
    assert next(decoder) == GOOD_RECORDS[1]
    with pytest.raises(NpuError):
        next(decoder)


def test_every_request_body_has_its_call_and_every_reply_body_its_request():
    """The typed protocol: one request body per call that answers, one reply body per call
    that returns values, named alike (npu.proto)."""
    from simnpu.proto import npu_pb2

    requests = {
        f.name: f.message_type.name
        for f in npu_pb2.Request.DESCRIPTOR.oneofs_by_name["body"].fields
    }
    replies = {
        f.name: f.message_type.name for f in npu_pb2.Reply.DESCRIPTOR.oneofs_by_name["body"].fields
    }
    assert len(set(requests.values())) == len(requests) and len(set(replies.values())) == len(
        replies
    )
    assert set(replies) <= set(requests)
    for case, body in requests.items():
        assert body.endswith("Request") and body[: -len("Request")] in (
            _camel(case),
            _camel(case) + "s",
        )
    for case, body in replies.items():
        assert body == requests[case][: -len("Request")] + "Reply"


def _camel(case: str) -> str:
    return "".join(part.capitalize() for part in case.split("_"))


def test_required_fields_are_found_nested_too():
    from simnpu.proto import messages, npu_pb2

    assert messages.missing(npu_pb2.CreateStreamRequest(context=1)) == ["priority", "flags"]
    assert (
        messages.missing(npu_pb2.CreateStreamRequest(context=0, priority=0, flags=0)) == []
    )  # 0 is a value
    partial = npu_pb2.MemcpyRequest(dst=npu_pb2.Location(space=npu_pb2.SPACE_DEVICE), count=4)
    assert messages.missing(partial) == ["dst.offset", "src"]
    assert messages.missing(npu_pb2.UseRingRequest()) == []


# ---- records only a submission ring carries (docs/fast-path.md) -------------------------------
def test_ring_records_decode_only_in_ring_mode():
    ring_only = [
        commands.RingRequest.pack(b"\x08\x01"),
        commands.RingStreamItem.RECORD,
        commands.RingSite.pack("file.py:12"),
    ]
    for packed in ring_only:
        with pytest.raises(NpuError) as raised:
            decode_all(packed)
        assert raised.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    launch, expected = CASES["launch"]
    assert list(commands.decode(b"".join([launch, *ring_only, launch]), ring=True)) == [
        expected,
        commands.RingRequest(b"\x08\x01"),
        commands.RingStreamItem(),
        commands.RingSite("file.py:12"),
        expected,
    ]


def test_ring_end_and_a_last_byte_end_a_ring_piece():
    launch, expected = CASES["launch"]
    end = commands.RING_END
    assert list(commands.decode(launch + end + b"garbage after the end", ring=True)) == [expected]
    assert list(commands.decode(launch + b"\x07", ring=True)) == [expected]


def test_a_truncated_ring_request_raises_107000():
    packed = commands.RingRequest.pack(b"0123456789")
    with pytest.raises(NpuError) as raised:
        list(commands.decode(packed[:-1], ring=True))
    assert raised.value.code == codes.ACL_ERROR_RT_PARAM_INVALID


def test_a_thread_limited_record_holds_a_launch_only():
    inner = commands.RecordEvent.pack(1, 2)
    got, error = decode_until_error(commands.ThreadLimited.pack(5, inner))
    assert got == [] and error.code == 107000 and "no launch" in error.message
    got, error = decode_until_error(commands.ThreadLimited.pack(5, b""))
    assert got == [] and "truncated" in error.message
    launch = commands.LaunchDeviceArgs.pack(1, 2, 3, 4, 5)
    got, error = decode_until_error(commands.ThreadLimited.pack(5, launch[:-1]))
    assert got == [] and "truncated" in error.message
