"""The wire form of in-stream copy chunks: a message's `bulk` bytes without protobuf's copies.

A client that cannot map the daemon's shared memory sends and receives copy chunks inside
the Session stream, in ClientMessage.bulk and ServerMessage.bulk. These functions are the
Session method's (de)serializers on both sides. The sender encodes the bulk field first,
straight from the memory the bytes are in (one copy, into the message), then the rest of
the message; the receiver takes a view of the bytes inside the received buffer and parses
only the rest. Fields may come in any order in protobuf, so this is an ordinary encoding of
the message, and a message encoded any other way is read the same (through a copy).
"""

from __future__ import annotations

from simnpu.proto import npu_pb2

_CLIENT_TAG = 0x22  # ClientMessage.bulk: field 4, length-delimited
_SERVER_TAG = 0x1A  # ServerMessage.bulk: field 3, length-delimited


def serialize(message) -> bytes:
    """A message, or bytes already encoded by client_message / server_message, as sent."""
    return message if message.__class__ is bytes else message.SerializeToString()


def client_message(message: npu_pb2.ClientMessage, bulk) -> bytes:
    """`message` with `bulk` (any buffer: host memory, a memoryview) as its bulk field."""
    return _encode(_CLIENT_TAG, bulk, message)


def server_message(reply: npu_pb2.Reply, bulk) -> bytes:
    """A ServerMessage of `reply` alone, with `bulk` (read now, into the message)."""
    return _encode(_SERVER_TAG, bulk, npu_pb2.ServerMessage(replies=[reply]))


def parse_client(raw: bytes) -> tuple[npu_pb2.ClientMessage, memoryview | None]:
    """A received ClientMessage and its bulk bytes (a view into `raw`), if it has any."""
    bulk, rest = _split(raw, _CLIENT_TAG)
    message = npu_pb2.ClientMessage.FromString(rest)  # type: ignore[arg-type]  # any buffer
    if message.bulk:  # encoded elsewhere in the message (or twice: the last one counts)
        bulk = memoryview(message.bulk)
    return message, bulk


def parse_server(raw: bytes):
    """A received ServerMessage; with bulk bytes, an object with the same `replies` and
    `notices` whose first reply's `bulk` is a view of them."""
    bulk, rest = _split(raw, _SERVER_TAG)
    message = npu_pb2.ServerMessage.FromString(rest)  # type: ignore[arg-type]  # any buffer
    if message.bulk:
        bulk = memoryview(message.bulk)
    if bulk is None:
        return message
    replies: list[npu_pb2.Reply | BulkReply] = list(message.replies)
    if replies:
        replies[0] = BulkReply(message.replies[0], bulk)
    return _BulkMessage(replies, message.notices)


class BulkReply:
    """A Reply with the bulk bytes of the message it came in; other fields as the Reply's."""

    __slots__ = ("_reply", "bulk")

    def __init__(self, reply: npu_pb2.Reply, bulk: memoryview):
        self._reply = reply
        self.bulk = bulk

    def __getattr__(self, name):
        return getattr(self._reply, name)


class _BulkMessage:
    __slots__ = ("notices", "replies")

    def __init__(self, replies: list, notices):
        self.replies = replies
        self.notices = notices


def _encode(tag: int, bulk, message) -> bytes:
    with memoryview(bulk) as view:
        return b"".join((_varint(tag), _varint(view.nbytes), view, message.SerializeToString()))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _split(raw: bytes, tag: int) -> tuple[memoryview | None, bytes | memoryview]:
    """(bulk, rest) of an encoding that starts with the bulk field, else (None, raw)."""
    if not raw or raw[0] != tag:
        return None, raw
    size = shift = 0
    at = 1
    while at < len(raw) and shift < 64:
        byte = raw[at]
        at += 1
        size |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if at + size > len(raw):
                break
            view = memoryview(raw)
            return view[at : at + size], view[at + size :]
    return None, raw  # malformed: protobuf's own parse says so
