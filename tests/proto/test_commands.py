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
        commands.pack_launch(3, 0x20000000001, 0x50000000002, b"\x01\x02\x03\x04\x05"),
        commands.Launch(3, 0x20000000001, 0x50000000002, b"\x01\x02\x03\x04\x05"),
    ),
    "launch, no args": (commands.pack_launch(1, 7, 9, b""), commands.Launch(1, 7, 9, b"")),
    "launch, max fields": (
        commands.pack_launch(U32, U64, U64, bytes(range(256)) * 3),
        commands.Launch(U32, U64, U64, bytes(range(256)) * 3),
    ),
    "launch devargs": (
        commands.pack_launch_devargs(48, 2, 5, (1 << 47) + 64, 24),
        commands.LaunchDevArgs(48, 2, 5, (1 << 47) + 64, 24),
    ),
    "copy pinned -> device": (
        commands.pack_copy(11, DEV, PIN, 4097),
        commands.Copy(11, DEV, PIN, 4097),
    ),
    "copy device -> staging": (
        commands.pack_copy(U64, STAGE, DEV, U64),
        commands.Copy(U64, STAGE, DEV, U64),
    ),
    "memset": (
        commands.pack_memset(12, DEV, 0xAB, 3 << 20),
        commands.Memset(12, DEV, 0xAB, 3 << 20),
    ),
    "record event": (
        commands.pack_event(commands.CMD_RECORD_EVENT, 0x30000000001, 2),
        commands.EventCommand(commands.CMD_RECORD_EVENT, 0x30000000001, 2),
    ),
    "reset event": (
        commands.pack_event(commands.CMD_RESET_EVENT, 4, 5),
        commands.EventCommand(commands.CMD_RESET_EVENT, 4, 5),
    ),
    "wait event": (
        commands.pack_event(commands.CMD_WAIT_EVENT, U64, U64),
        commands.EventCommand(commands.CMD_WAIT_EVENT, U64, U64),
    ),
    "host callback": (
        commands.pack_host(commands.CMD_HOST_CALLBACK, 2, 99, True),
        commands.HostCallback(commands.CMD_HOST_CALLBACK, 2, 99, 1),
    ),
    "host done": (
        commands.pack_host(commands.CMD_HOST_DONE, 2, 99, False),
        commands.HostCallback(commands.CMD_HOST_DONE, 2, 99, 0),
    ),
    "collective": (
        commands.pack_collective(
            commands.Collective(
                U64, (16 << 40) | 1, 2, DEV.offset, DEV.offset + 64, U64, 7, 4, 11, 3, U32
            )
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
    assert ops == set(commands._FIXED)


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
    assert len(commands.pack_launch(1, 2, 3, b"abc")) == commands.LAUNCH.size + 3
    assert len(commands.pack_launch_devargs(1, 2, 3, 4, 5)) == commands.LAUNCH_DEVARGS.size
    assert len(commands.pack_copy(1, DEV, PIN, 5)) == commands.COPY.size
    assert len(commands.pack_memset(1, DEV, 0, 5)) == commands.MEMSET.size
    assert len(commands.pack_event(commands.CMD_RECORD_EVENT, 1, 2)) == commands.EVENT.size


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
    record = commands.LAUNCH.pack(commands.CMD_LAUNCH, 1, 2, 3, 100) + b"\0" * 99
    got, error = decode_until_error(GOOD_BYTES + record)
    assert got == GOOD_RECORDS
    assert error.code == codes.ACL_ERROR_RT_PARAM_INVALID
    assert "launch arguments truncated" in error.message


def test_launch_with_a_huge_args_length():
    record = commands.LAUNCH.pack(commands.CMD_LAUNCH, 1, 2, 3, U32)
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


def test_request_arguments_are_declared_for_every_request_op():
    from simnpu.proto import npu_pb2

    declared = set(commands.REQUEST_ARGS)
    ops = {
        name[len("OP_") :]
        for name in npu_pb2.Op.DESCRIPTOR.values_by_name
        if name != "OP_UNSPECIFIED"
    }
    assert ops <= declared


# ---- records only a submission ring carries (docs/fast-path.md) -------------------------------
def test_ring_records_decode_only_in_ring_mode():
    ring_only = [commands.pack_ring_request(b"\x08\x01"), commands.STREAM_ITEM,
                 commands.pack_ring_site("file.py:12")]
    for packed in ring_only:
        with pytest.raises(NpuError) as raised:
            decode_all(packed)
        assert raised.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    launch, expected = CASES["launch"]
    assert list(commands.decode(b"".join([launch, *ring_only, launch]), ring=True)) == [
        expected, commands.RingRequest(b"\x08\x01"), commands.StreamItem(), commands.RingSite("file.py:12"),
        expected]


def test_ring_end_and_a_last_byte_end_a_ring_piece():
    launch, expected = CASES["launch"]
    end = struct.pack("<H", commands.CMD_RING_END)
    assert list(commands.decode(launch + end + b"garbage after the end", ring=True)) == [expected]
    assert list(commands.decode(launch + b"\x07", ring=True)) == [expected]


def test_a_truncated_ring_request_raises_107000():
    packed = commands.pack_ring_request(b"0123456789")
    with pytest.raises(NpuError) as raised:
        list(commands.decode(packed[:-1], ring=True))
    assert raised.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
