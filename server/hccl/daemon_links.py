"""The Peer streams between the daemons of one HCCL world across hosts (docs/multihost.md).

A member daemon opens one stream per world to the world's coordinator (`Outgoing`); the
coordinator's servicer serves each such stream as an `Incoming`. Both are a `Link`:
`send` queues a PeerMessage and never blocks; each message that arrives goes to the
link's `on_message`, from the link's own thread, and its end (the peer closed it, its
daemon died, the connection broke) to `on_end`, once, with the reason. A host that is
cut off is found within seconds either way: outgoing streams ping (gRPC keepalive) every
second and give up after 3 s without an answer; they also send a heartbeat message every
second, and an incoming stream that hears nothing for 3 s ends.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from simnpu.proto import npu_pb2 as pb
from simnpu.proto import service

PEER_METHOD = f"/{service.SERVICE}/Peer"
KEEPALIVE = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 3000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
# what a daemon's server must allow for its members' keepalive pings
SERVER_KEEPALIVE = [
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.keepalive_permit_without_calls", 1),
]

CLOSE_GRACE_S = 10.0  # how long a closed outgoing stream waits for its peer to end it
HEARTBEAT_S = 1.0  # an outgoing stream's heartbeat period
SILENCE_S = 3.0  # an incoming stream that hears nothing this long ends
OnMessage = Callable[["Link", pb.PeerMessage], None]
OnEnd = Callable[["Link", str], None]
_CLOSE = object()


class Link:
    """One Peer stream, either end. `address` is the other daemon's advertised address
    (for an incoming link, what its hello said)."""

    def __init__(self, address: str, on_message: OnMessage, on_end: OnEnd):
        self.address = address
        self._on_message = on_message
        self._on_end = on_end
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ended = threading.Event()
        self._ending = threading.Lock()
        self.heard = time.monotonic()  # when the last message arrived

    def send(self, message: pb.PeerMessage) -> None:
        """Queue `message` for the peer; never blocks (dropped once the link has ended)."""
        if not self._ended.is_set():
            self._outbox.put(message)

    def close(self) -> None:
        """End the stream from this side; `on_end` is not called for it."""
        self._ended.set()
        self._outbox.put(_CLOSE)

    def _outgoing(self) -> Iterator[pb.PeerMessage]:
        while True:
            message = self._outbox.get()
            if message is _CLOSE:
                return
            yield message

    def _deliver(self, messages: Iterator[pb.PeerMessage]) -> None:
        """Pass what arrives to on_message until the stream ends, then report its end."""
        reason = "the peer daemon closed the stream"
        try:
            for message in messages:
                self.heard = time.monotonic()
                if message.WhichOneof("body") != "heartbeat":
                    self._on_message(self, message)
        except grpc.RpcError as error:
            details = error.details() if hasattr(error, "details") else None
            reason = "the connection to the peer daemon broke: " + (
                details or "its daemon died, or the network between the hosts failed"
            )
        self._end(reason)

    def _end(self, reason: str) -> None:
        """The stream is over: report it, once (not after close())."""
        with self._ending:
            if self._ended.is_set():
                return
            self._ended.set()
        self._outbox.put(_CLOSE)
        self._on_end(self, reason)


class Outgoing(Link):
    """A member's stream to a coordinator at `address` (TCP, with the shared token)."""

    def __init__(
        self,
        address: str,
        token: str,
        hello: pb.PeerHello,
        on_message: OnMessage,
        on_end: OnEnd,
    ):
        super().__init__(address, on_message, on_end)
        self._channel = grpc.insecure_channel(
            address, options=[*service.CLIENT_CHANNEL_OPTIONS, *KEEPALIVE]
        )
        self._call = self._channel.stream_stream(
            PEER_METHOD,
            request_serializer=pb.PeerMessage.SerializeToString,
            response_deserializer=pb.PeerMessage.FromString,
        )
        self.send(pb.PeerMessage(hello=hello))
        self._responses = self._call(
            self._outgoing(), metadata=((service.TOKEN_METADATA_KEY, token),)
        )
        threading.Thread(target=self._run, name="simnpu-peer-out", daemon=True).start()

    def _run(self) -> None:
        threading.Thread(target=self._beat, name="simnpu-peer-heartbeat", daemon=True).start()
        try:
            self._deliver(self._responses)
        finally:
            self._channel.close()

    def _beat(self) -> None:
        while not self._ended.wait(HEARTBEAT_S):
            self._outbox.put(pb.PeerMessage(heartbeat=pb.PeerHeartbeat()))

    def close(self) -> None:
        """End the stream from this side once what was queued is sent (a PeerLeft must
        arrive before the end); the call is cancelled if the peer has not ended it
        within CLOSE_GRACE_S."""
        super().close()
        timer = threading.Timer(CLOSE_GRACE_S, self._responses.cancel)
        timer.daemon = True
        timer.start()


class Incoming(Link):
    """A member's stream as the coordinator's servicer serves it: `serve` runs on the
    gRPC thread, delivering in a thread of its own while it yields the outbox."""

    def serve(self, requests: Iterator[pb.PeerMessage]) -> Iterator[pb.PeerMessage]:
        threading.Thread(
            target=self._deliver, args=(requests,), name="simnpu-peer-in", daemon=True
        ).start()
        threading.Thread(target=self._watch, name="simnpu-peer-watch", daemon=True).start()
        return self._outgoing()

    def _watch(self) -> None:
        """End the stream when the member has been silent for SILENCE_S (cut off, hung)."""
        while not self._ended.wait(SILENCE_S / 6):
            silent = time.monotonic() - self.heard
            if silent > SILENCE_S:
                self._end(
                    f"no word from the peer daemon for {silent:.0f} s: it was cut off or hangs"
                )
