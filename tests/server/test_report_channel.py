"""The daemon's end of a kernel process's socket (server/units/report_channel.py), against a
real socket pair whose other end is what a kernel process holds: a multiprocessing
`Connection`, or raw writes of what a hostile kernel could write on it."""

from __future__ import annotations

import socket
import struct
import threading
from multiprocessing.connection import Connection

import pytest

from simnpu.server.core.unit_protocol import Cancel
from simnpu.server.units.report_channel import BadFrame, ReportChannel
from simnpu.server.units.report_codec import MAX_REPORT, BadReport

DEADLINE_S = 60.0  # a call that has not returned by then is taken to block


@pytest.fixture
def pair():
    """(the daemon's channel, the kernel process's raw socket)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    channel = ReportChannel(ours)
    yield channel, theirs
    channel.close()
    theirs.close()


def framed(payload: bytes) -> bytes:
    """`payload` as Connection.send_bytes frames it."""
    return struct.pack("!i", len(payload)) + payload


def returns(call, *args):
    """What `call(*args)` returns, asserting it returns (it must never block)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(("value", call(*args)))
        except BaseException as error:  # noqa: BLE001 - raised below
            outcome.append(("error", error))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"{call.__name__} blocked"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


def test_frames_a_connection_sends_come_back_whole(pair):
    channel, theirs = pair
    conn = Connection(theirs.detach())
    payloads = [b"", b"x", b'["results", []]', bytes(range(256)) * 100, b"y" * MAX_REPORT]
    received: list[bytes] = []

    def write() -> None:
        for payload in payloads:
            conn.send_bytes(payload)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        while len(received) < len(payloads):
            received += returns(channel.receive)
    finally:
        writer.join()
        conn.close()
    assert received == payloads
    assert channel.unfinished == 0


def test_nothing_written_is_no_frame(pair):
    channel, _ = pair
    assert returns(channel.receive) == []


def test_a_partial_frame_waits_for_its_rest(pair):
    channel, theirs = pair
    data = framed(b"z" * 4000)
    theirs.sendall(data[:5])  # a length of 4000 and one byte, as a stalling kernel writes
    assert returns(channel.receive) == []
    assert returns(channel.receive) == []
    assert channel.unfinished == 5
    theirs.sendall(data[5:])
    assert returns(channel.receive) == [b"z" * 4000]
    assert channel.unfinished == 0


def test_a_header_alone_waits_for_its_payload(pair):
    channel, theirs = pair
    theirs.sendall(struct.pack("!i", 4000))
    assert returns(channel.receive) == []
    assert channel.unfinished == 4


@pytest.mark.parametrize("long_header", [False, True])
def test_frames_split_at_every_byte(pair, long_header):
    """Three frames written a byte at a time, the channel read after each byte: each
    comes back once, whole, when its last byte is in."""
    channel, theirs = pair
    payloads = [b"first", b"", b"third" * 30]
    if long_header:  # the -1 prefix and an 8-byte length, which Connection uses for > 2 GiB
        stream = b"".join(struct.pack("!i", -1) + struct.pack("!Q", len(p)) + p for p in payloads)
    else:
        stream = b"".join(framed(p) for p in payloads)
    received: list[bytes] = []
    for index in range(len(stream)):
        theirs.sendall(stream[index : index + 1])
        received += returns(channel.receive)
    assert received == payloads


def test_a_stream_split_at_every_point(pair):
    channel, theirs = pair
    payloads = [b'["accesses", 1, [], null]', b'["results", []]']
    stream = b"".join(framed(p) for p in payloads)
    for cut in range(len(stream) + 1):
        received: list[bytes] = []
        for piece in (stream[:cut], stream[cut:]):
            if piece:
                theirs.sendall(piece)
            received += returns(channel.receive)
        assert received == payloads, cut


@pytest.mark.parametrize(
    "header",
    [
        struct.pack("!i", MAX_REPORT + 1),  # one byte more than a report may have
        struct.pack("!i", 0x7FFFFFFF),
        struct.pack("!i", -1) + struct.pack("!Q", MAX_REPORT + 1),
        struct.pack("!i", -1) + struct.pack("!Q", (1 << 64) - 1),
        struct.pack("!i", -2),  # a negative length
        struct.pack("!i", -(1 << 31)),
        b"GET ",  # garbage: a length of 1.2 GB
        b"\xff\xff\xff\xfe",
    ],
)
def test_a_header_no_report_may_have_is_refused_before_its_payload(pair, header):
    channel, theirs = pair
    theirs.sendall(header)  # nothing of a payload follows: refused on the header alone
    with pytest.raises(BadFrame):
        returns(channel.receive)
    assert issubclass(BadFrame, BadReport)  # the executor ends the process for it


def test_a_bad_header_after_a_good_frame_is_refused(pair):
    channel, theirs = pair
    theirs.sendall(framed(b"good") + struct.pack("!i", -7))
    with pytest.raises(BadFrame):
        returns(channel.receive)


def test_a_frame_of_the_longest_report_is_taken(pair):
    channel, theirs = pair
    payload = b"r" * MAX_REPORT
    writer = threading.Thread(target=theirs.sendall, args=(framed(payload),))
    writer.start()
    received: list[bytes] = []
    try:
        while not received:
            received = returns(channel.receive)
    finally:
        writer.join()
    assert received == [payload]


def test_a_peer_that_never_reads_never_blocks_a_send(pair):
    """Messages far beyond what the socket holds: every send returns at once; what did not
    fit waits, and reaches the peer in order once it reads and the channel is flushed."""
    channel, theirs = pair
    messages = [Cancel([index]) for index in range(3)] + [["batch", "m" * (1 << 20)]] * 4
    done = [returns(channel.send, message) for message in messages]
    assert done[-1] is False and channel.pending
    assert returns(channel.flush) is False  # still nobody reads
    conn = Connection(theirs.detach())
    received: list = []

    def read() -> None:
        while len(received) < len(messages):
            received.append(conn.recv())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while returns(channel.flush) is False:
            reader.join(0.001)  # (the peer reads meanwhile)
        reader.join(DEADLINE_S)
    finally:
        conn.close()
    assert received == messages
    assert not channel.pending


def test_a_closed_peer_ends_reading_after_its_last_whole_frame(pair):
    channel, theirs = pair
    theirs.sendall(framed(b"last") + framed(b"cut short")[:6])
    theirs.close()
    assert returns(channel.receive) == [b"last"]
    with pytest.raises(EOFError):
        returns(channel.receive)


def test_a_closed_peer_fails_a_send_and_a_flush(pair):
    channel, theirs = pair
    assert returns(channel.send, ["x" * (1 << 20)]) is False  # part of it waits
    theirs.close()
    with pytest.raises(OSError):
        returns(channel.flush)
    with pytest.raises(OSError):
        returns(channel.send, Cancel([1]))


def test_a_closed_channel_refuses_everything_and_closes_once(pair):
    channel, _ = pair
    channel.close()
    channel.close()
    assert channel.closed
    for call, args in ((channel.receive, ()), (channel.send, (None,)), (channel.fileno, ())):
        with pytest.raises(OSError):
            call(*args)
