"""The bulk wire form: what simnpu's sender encodes is the protobuf encoding of the message
with its bulk field; the receiver takes the bytes as a view and reads messages encoded any
other way the same; malformed input fails as protobuf's own parse does."""

import ctypes

import pytest
from google.protobuf.message import DecodeError

from simnpu.proto import bulk, npu_pb2

SIZES = [0, 1, 127, 128, 300, 1 << 14, (1 << 20) + 3]  # 1-, 2- and 3-byte varint lengths


def request_message() -> npu_pb2.ClientMessage:
    return npu_pb2.ClientMessage(
        items=[
            npu_pb2.Item(commands=b"\x01\x02"),
            npu_pb2.Item(
                request=npu_pb2.Request(
                    id=7,
                    memcpy=npu_pb2.MemcpyRequest(
                        dst=npu_pb2.Location(space=npu_pb2.SPACE_DEVICE, offset=1 << 50), count=2
                    ),
                )
            ),
        ],
        site_seqs=[3],
        sites=["app.py:9"],
    )


@pytest.mark.parametrize("size", SIZES)
def test_a_client_message_with_bulk_is_its_protobuf_encoding(size):
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    source = ctypes.create_string_buffer(data, size)  # host memory, read straight into the message
    raw = bulk.client_message(request_message(), (ctypes.c_char * size).from_buffer(source))
    expected = request_message()
    expected.bulk = data
    assert npu_pb2.ClientMessage.FromString(raw) == expected
    message, view = bulk.parse_client(raw)
    assert message == request_message()  # parsed without the bulk field
    assert isinstance(view, memoryview) and view.obj is raw  # a view into the received bytes
    assert view.tobytes() == data


def test_a_client_message_encoded_elsewhere_is_read_the_same():
    plain = request_message()
    assert bulk.parse_client(plain.SerializeToString()) == (plain, None)
    plain.bulk = b"after the items"  # protobuf's own encoder puts field 4 last
    message, view = bulk.parse_client(plain.SerializeToString())
    assert view.tobytes() == b"after the items" and list(message.items) == list(plain.items)


@pytest.mark.parametrize("size", SIZES)
def test_a_reply_with_bulk_reads_as_the_reply_with_those_bytes(size):
    data = b"\xab" * size
    raw = bulk.server_message(npu_pb2.Reply(id=9, code=0, task_seq=4), memoryview(data))
    assert npu_pb2.ServerMessage.FromString(raw) == npu_pb2.ServerMessage(
        replies=[npu_pb2.Reply(id=9, task_seq=4)], bulk=data
    )
    message = bulk.parse_server(raw)
    (reply,) = message.replies
    assert (reply.id, reply.code, reply.message, reply.task_seq) == (9, 0, "", 4)
    assert reply.bulk.tobytes() == data and reply.bulk.obj is raw
    assert list(message.notices) == []


def test_server_messages_without_bulk_are_plain_messages():
    plain = npu_pb2.ServerMessage(
        replies=[npu_pb2.Reply(id=1, message="small")],
        notices=[npu_pb2.Notice(kind=npu_pb2.Notice.KIND_HOST_CALLBACK, callback=3)],
    )
    assert bulk.parse_server(plain.SerializeToString()) == plain
    plain.bulk = b"encoded last"
    reply = bulk.parse_server(plain.SerializeToString()).replies[0]
    assert reply.id == 1 and reply.bulk.tobytes() == b"encoded last"


def test_serialize_passes_encoded_messages_through():
    raw = bulk.client_message(request_message(), b"xyz")
    assert bulk.serialize(raw) is raw
    assert bulk.serialize(request_message()) == request_message().SerializeToString()


@pytest.mark.parametrize(
    "raw",
    [
        b"\x22",  # the bulk tag, no length
        b"\x22\x80",  # a length whose varint never ends
        b"\x22\x05abc",  # a length past the end
        b"\x22\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a length of more than 64 bits
        b"\x22\x01x\xff\xff",  # good bulk, garbage after it
        b"\xff\xff",
    ],
)
def test_malformed_messages_fail_as_protobuf_fails(raw):
    with pytest.raises(DecodeError):
        bulk.parse_client(raw)
    with pytest.raises(DecodeError):
        bulk.parse_server(b"\x1a" + raw[1:] if raw[:1] == b"\x22" else raw)
