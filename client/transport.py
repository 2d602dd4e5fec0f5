"""The client end of a session: one gRPC bidirectional stream to the daemon, the calls sent
on it, and where each was made.

Asynchronous commands are packed records (simnpu.proto.commands) appended to a queue; one
sender (the request iterator gRPC drains) coalesces whatever is queued into a single
ClientMessage, so a burst of launches costs one message. Requests (npu.proto's typed
bodies) wait for their Reply (client/replies.py). Every command and request takes the next
sequence number, as on the daemon (`CallLog`), and the call site of each (`call_site`,
taken where the public call entered) is kept so that a task failing later is reported with
where it was submitted.

With shared memory (docs/fast-path.md) the session has a fast path both ways: calls are
written into its submission ring by the calling thread itself (no sender thread, no
message), replies come back through the notify area's mailbox slots while the waiting
thread sleeps on a futex. The stream then only carries requests too big for the ring,
notices and replies too big for a slot, read by the background receiver all the time.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from simnpu.client import config
from simnpu.proto import codes, commands, messages, npu_pb2, service

config.prefer_fast_grpc()

import grpc  # noqa: E402
from google.protobuf.message import Message  # noqa: E402

from simnpu.client import autostart, peer_credentials  # noqa: E402
from simnpu.client.replies import (  # noqa: E402
    Mailbox,
    Pending,
    ReaderRole,
    describe_rpc_error,
    write_device_output,
)
from simnpu.proto import bulk as wire  # noqa: E402
from simnpu.proto.errors import NpuError, error_for  # noqa: E402
from simnpu.shm import notify as notify_layout  # noqa: E402
from simnpu.shm import ring as ring_layout  # noqa: E402

if TYPE_CHECKING:
    from types import FrameType

_SITE_RING = 1 << 16
_SITE_MASK = _SITE_RING - 1
_MAX_RECORD = ring_layout.MAX_RECORD
_thread_id = threading.get_ident
_OWN_MODULES = ("simnpu.", "acl", "hccl")
_Item = npu_pb2.Item
_ClientMessage = npu_pb2.ClientMessage


_codes: dict = {}  # id -> every code object call_site has met, kept so that its id stays its own
_own_ids: set = set()  # ids of those that belong to simnpu's client packages
_site_names: dict = {}  # (id of a code object, instruction offset) -> "file:line"


def call_site() -> str:
    """file:line of the first frame outside simnpu's client packages above the function
    that asks (as warnings' stacklevel, counted from the asker's caller on): where a public
    call entered. The facade's generated functions, the Pythonic API and hccl take it once
    and pass it down (`site=`) to what sends the call; a part of the runtime called directly
    by a program takes it itself.

    On every asynchronous call, so the answers are cached: which code objects are ours,
    and the text of each call site seen, keyed by instruction offset (f_lineno decodes
    the line table each time: ~10 µs in a long module-level script). The caches go by
    the code object's id: hashing a code object hashes its bytecode and constants each
    time (~0.25 µs a frame)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        ident = id(code)
        if ident in _own_ids:
            frame = frame.f_back
            continue
        key = (ident, frame.f_lasti)
        name = _site_names.get(key)
        if name is not None:
            return name
        if ident not in _codes:  # first met: ours?
            _codes[ident] = code
            if frame.f_globals.get("__name__", "").startswith(_OWN_MODULES):
                _own_ids.add(ident)
                frame = frame.f_back
                continue
        name = _site_names[key] = f"{code.co_filename}:{frame.f_lineno}"
        return name
    return "?"


class CallLog:
    """The sequence numbers of this session's calls, as the daemon numbers them, and what the
    client keeps of each: its call site (the last 65,536; for a command also its stream, the
    thread that sent it and its record, which an exception-info callback reports), the last
    command of each stream and of each thread, and the last call whose failure is reported
    later; once the session is observed, which sites the daemon has been told. Used under
    the connection's lock.

    The last calls are kept in parallel lists made once, not a tuple per call: a call then
    leaves no new object the cyclic collector counts, so a session's first 65,536 calls
    trigger no collections (a tuple each made the first 100,000 launches pay a full
    collection of the program's heap, ~0.15 µs a launch)."""

    __slots__ = (
        "_deferred_seq",
        "_records",
        "_seqs",
        "_sites",
        "_stream_seq",
        "_streams",
        "_thread_seq",
        "_threads",
        "kept",
        "observed",
        "ring_site",
        "seq",
        "sites_sent",
    )

    def __init__(self) -> None:
        self.seq = 0
        self._seqs: list[int] = [0] * _SITE_RING  # slot -> the sequence number it holds
        self._sites: list[str] = [""] * _SITE_RING
        self._records: list[bytes | None] = [None] * _SITE_RING  # None: not a command
        self._streams: list[int] = [0] * _SITE_RING
        self._threads: list[int] = [0] * _SITE_RING
        self._stream_seq: dict[int, int] = {}  # stream -> sequence number of its last command
        self._thread_seq: dict[int, int] = {}  # thread ident -> number of its last command
        self._deferred_seq = 0  # the last call whose failure is reported later (a command, a free)
        self.observed = False  # tracing or checking: call sites travel with the calls
        self.sites_sent = 0  # sequence numbers up to here have had their sites sent (no ring)
        self.ring_site: str | None = None  # the call site last sent through the ring
        self.kept: dict[int, str] = {}  # sites of calls recorded in a live model (aclmdlRI)

    def observe(self) -> None:
        """From the next call on, the daemon is told each call's site."""
        self.sites_sent = self.seq
        self.observed = True

    def take(self, site: str, deferred: bool = False) -> int:
        """The next sequence number, for a request at `site` (`deferred`: one whose failure
        is reported later)."""
        self.seq = seq = self.seq + 1
        slot = seq & _SITE_MASK
        self._seqs[slot] = seq
        self._sites[slot] = site
        self._records[slot] = None
        if deferred:
            self._deferred_seq = seq
        return seq

    def take_command(self, site: str, stream: int, record: bytes) -> int:
        """The next sequence number, for an asynchronous command at `site` on `stream` (0:
        none) with its packed `record`; its failure is reported later."""
        self.seq = seq = self.seq + 1
        thread = _thread_id()
        slot = seq & _SITE_MASK
        self._seqs[slot] = seq
        self._sites[slot] = site
        self._records[slot] = record
        self._streams[slot] = stream
        self._threads[slot] = thread
        self._thread_seq[thread] = seq
        self._deferred_seq = seq
        if stream:
            self._stream_seq[stream] = seq
        return seq

    # ---- what a synchronize on the streams' signals reads (client/runtime/synchronization.py)
    def last_command(self, stream: int) -> int:
        """The sequence number of `stream`'s last command (0: none known)."""
        return self._stream_seq.get(stream, 0)

    def last_deferred(self) -> int:
        """The sequence number of the session's latest call whose failure is reported later
        (a command, a free; 0: none yet)."""
        return self._deferred_seq

    def covering_command(self, stream: int) -> int:
        """The sequence number of `stream`'s last command if that command is also the
        session's latest call whose failure is reported later (a clean signal at or past
        it then proves every earlier call ran or was reported); else 0."""
        seq = self._stream_seq.get(stream, 0)
        return seq if seq == self._deferred_seq else 0

    def forget_stream(self, stream: int) -> None:
        """`stream` is gone: its last command is not looked for any more."""
        self._stream_seq.pop(stream, None)

    def last_command_of_thread(self, thread: int) -> int:
        """The sequence number of the last command thread `thread` sent (0: none)."""
        return self._thread_seq.get(thread, 0)

    def site_of(self, seq: int) -> str | None:
        slot = seq & _SITE_MASK
        if self._seqs[slot] == seq and self._sites[slot]:
            return self._sites[slot]
        return self.kept.get(seq)

    def keep(self, seqs: Iterable[int]) -> None:
        """Keep the sites of calls a model recorded while it lives (a replay's failure names
        the site where its task was captured)."""
        for seq in seqs:
            site = self.site_of(seq)
            if site is not None:
                self.kept[seq] = site

    def forget(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            self.kept.pop(seq, None)

    def command(self, seq: int) -> tuple[int, int, bytes] | None:
        """(stream, thread ident, packed record) of command `seq`, if it is still known."""
        slot = seq & _SITE_MASK
        record = self._records[slot]
        if record is None or self._seqs[slot] != seq:
            return None
        return self._streams[slot], self._threads[slot], record

    def unsent_sites(self) -> tuple[list[int], list[str]]:
        """The sites of every sequence number used since the last call of this (observed
        sessions without a ring send them with each message)."""
        first, last = self.sites_sent + 1, self.seq
        self.sites_sent = last
        seqs, names = [], []
        for seq in range(max(first, last - _SITE_RING + 1), last + 1):
            slot = seq & _SITE_MASK
            if self._seqs[slot] == seq:
                seqs.append(seq)
                names.append(self._sites[slot] or "?")
        return seqs, names

    def describe_failure(self, reply: npu_pb2.Reply) -> str:
        """A failure's message, with where its task was submitted."""
        if not reply.task_seq:
            return reply.message
        where = self.site_of(reply.task_seq) or "an earlier call"
        return f"{reply.message}\n(the failing task was submitted at {where})"


class _BulkRequest:
    """A queued request whose chunk bytes (`bulk`, a buffer) end the message it goes in."""

    __slots__ = ("bulk", "request")

    def __init__(self, request: npu_pb2.Request, bulk):
        self.request = request
        self.bulk = bulk


class Connection:
    """A live session with the daemon at `address`."""

    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        on_callback: Callable[[int], None] | None = None,
    ):
        self.on_callback = on_callback  # called (receiver thread) with a host callback's id
        self.address = address or config.address()
        try:
            self.token = token if token is not None else config.token()
        except (OSError, ValueError) as error:  # SIMNPU_TOKEN_FILE: unreadable, malformed
            raise NpuError(
                codes.ACL_ERROR_RT_NO_PERMISSION, f"SIMNPU_TOKEN_FILE: {error}"
            ) from None
        self.log = CallLog()
        self._lock = threading.Lock()  # the log, the queue, the ring: calls are numbered in order
        self._pending_items: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._replies: dict[int, Pending] = {}
        self._broken: NpuError | None = None
        self._closing = False
        self._reader = ReaderRole()
        self.mailbox: Mailbox | None = None  # use_notify()
        self.ring: ring_layout.SubmissionRing | None = None  # use_ring()
        self._open()

    def _open(self) -> None:
        if not autostart.reachable(self.address):
            autostart.ensure_daemon(self.address)
        self._channel = grpc.insecure_channel(self.address, options=service.CLIENT_CHANNEL_OPTIONS)
        # this process as the daemon sees it (0: unverified): aclrtDeviceGetBareTgid
        self.verified_pid, metadata = peer_credentials.ask(self.address)
        if self.token:
            metadata.append((service.TOKEN_METADATA_KEY, self.token))
        session = self._channel.stream_stream(
            service.SESSION_METHOD,
            request_serializer=wire.serialize,
            response_deserializer=wire.parse_server,
        )
        self._call = session(self._messages(), metadata=metadata)
        self._receiver = threading.Thread(target=self._receive, name="simnpu-receiver", daemon=True)
        self._receiver.start()

    # ---- sending --------------------------------------------------------------------------
    def use_notify(self, area: notify_layout.NotifyArea) -> None:
        """From now on replies come through `area`'s mailbox (the session's notify area);
        the background receiver reads the stream all the time."""
        with self._lock:
            self.mailbox = Mailbox(area)
        self._reader.wake()

    def use_ring(self, ring: ring_layout.SubmissionRing) -> None:
        """From now on calls go through the session's submission ring (the daemon is told
        first, by the stream). Blocks."""
        ring.reader_gone = lambda: self._broken is not None
        self.call(npu_pb2.UseRingRequest())
        with self._lock:
            self.ring = ring

    def send_command(self, record: bytes, site: str, stream: int = 0) -> int:
        """Queue one packed asynchronous command (on `stream`, if it goes to one); returns its
        sequence number. Never blocks, but for room in a full submission ring. A record too
        big for the ring is refused (107000) before it takes a number."""
        if self._broken is not None:
            raise self._broken
        if len(record) > _MAX_RECORD and self.ring is not None:
            raise NpuError(
                codes.ACL_ERROR_RT_PARAM_INVALID,
                f"a command of {len(record)} bytes is more than the submission ring takes "
                f"({_MAX_RECORD})",
            )
        lock = self._lock
        lock.acquire()  # not `with`: its __exit__ call costs a launch ~70 ns more
        try:
            log = self.log
            seq = log.take_command(site, stream, record)
            ring = self.ring
            if ring is not None:
                if log.observed:
                    self._put(record, site)
                    return seq
                try:
                    ring.put(record)
                except ring_layout.RingClosed:  # full, and the daemon is gone
                    assert self._broken is not None  # the ring closes once the session broke
                    raise self._broken from None
                return seq
            self._pending_items.append(record)
        finally:
            lock.release()
        if not self._wake.is_set():
            self._wake.set()
        return seq

    def call(self, body: Message, site: str = "") -> Any:
        """Send a request and block until its reply: the reply body of the same name (None
        when the call returns no values). Raises NpuError with the reply's code."""
        return messages.reply_body(self.wait(self.request_async(body, site)), body)

    def request_async(self, body: Message, site: str = "", bulk=None) -> Pending:
        """Queue a request; the returned handle is passed to wait(). `bulk` (a buffer, read
        when the message is sent) goes as the message's bulk bytes (proto/bulk.py); only
        in-stream copies have it, and they never have a ring."""
        # the message is built before a number and a slot are taken: a body it refuses
        # leaves no trace, and the session stays in step with the daemon
        request = messages.request(0, 0, body)
        with self._lock:  # under the lock: _fail_all cannot miss a request registered here
            if self._broken is not None:
                raise self._broken
            seq = self.log.take(site)
            mailbox = self.mailbox
            pending = self._replies[seq] = Pending(
                seq, mailbox.free.pop() if mailbox is not None and mailbox.free else -1
            )
            request.id, request.mailbox = seq, pending.slot + 1
            if bulk is None:
                self._queue_request(request, site)
            else:
                self._pending_items.append(_BulkRequest(request, bulk))
                self._wake.set()
        return pending

    def post(self, body: Message, site: str) -> int:
        """Queue a request nobody waits for (id 0: the daemon sends no reply and reports a
        failure at the next synchronize); returns its sequence number. Never blocks."""
        request = messages.request(0, 0, body)
        if self._broken is not None:
            raise self._broken
        with self._lock:
            seq = self.log.take(site, deferred=True)
            self._queue_request(request, site)
        return seq

    def _queue_request(self, request: npu_pb2.Request, site: str) -> None:
        """Into the ring if it is in use and the request fits, else to the stream (marked in
        the ring at its place). The caller holds the lock."""
        if self.ring is not None:
            payload = request.SerializeToString()
            if len(payload) + 6 <= ring_layout.MAX_RECORD:
                self._put(commands.RingRequest.pack(payload), site)
                return
            self._put(commands.RingStreamItem.RECORD, site)
        self._pending_items.append(request)
        self._wake.set()

    def _put(self, record: bytes, site: str) -> None:
        """Put a call's record in the ring (after its site when observed and it differs from
        the last call's) and wake the daemon if it sleeps; the caller holds the lock. The
        calling thread wakes it itself: no other thread of this process is woken for a
        call, and the daemon starts on the record while the caller goes on (in a burst of
        launches the daemon sleeps only when it has caught up)."""
        ring = self.ring
        assert ring is not None  # the callers put records only while the ring is in use
        try:
            log = self.log
            if log.observed and site != log.ring_site:  # a loop sends its site once
                ring.put(commands.RingSite.pack(site or "?"), False)
                log.ring_site = site
            ring.put(record)
        except ring_layout.RingClosed:  # full, and the daemon is gone
            assert self._broken is not None  # the ring closes once the session broke
            raise self._broken from None

    def ring_doorbell(self) -> None:
        """Before a thread sleeps on an answer: wake the daemon if it sleeps with records
        not taken, a wake-up lost to the ring's memory-ordering window (docs/fast-path.md).
        Never wakes a daemon that took everything."""
        if self.ring is not None:
            self.ring.wake_reader()

    # ---- waiting ------------------------------------------------------------------------------
    def wait(self, pending: Pending) -> npu_pb2.Reply:
        """Block until the reply arrives; raise NpuError if it carries an error code."""
        if pending.slot >= 0:
            assert self.mailbox is not None  # slots are handed out once use_notify made it
            self.mailbox.wait(pending, self._lock, self._replies)
        while not pending.event.is_set():
            if self._reader.claim_for(pending):
                self._read_turn()
        reply = pending.reply
        if isinstance(reply, NpuError):
            raise reply
        assert reply is not None  # its event is set: the reply (or the error) is in
        if reply.device_output:  # a synchronize's: kernels printed
            write_device_output(reply.device_output)
        if reply.code:
            error = error_for(reply.code, self.log.describe_failure(reply))
            error.task_seq = reply.task_seq
            raise error
        return reply

    def site_of(self, seq: int) -> str | None:
        """The call site of sequence number `seq`, if it is still known (the last 65,536)."""
        return self.log.site_of(seq)

    def _messages(self):
        """The request iterator gRPC drains: one message per wake-up, holding all queued items."""
        pending = self._pending_items
        while True:
            if not pending:  # checked before every wait: a close() whose wake-up was
                if self._closing:  # absorbed while a message was built still ends the stream
                    return
                self._wake.wait()
                self._wake.clear()
                continue
            items = []
            run: list = []
            bulk = None
            while pending:
                item = pending.popleft()
                if item.__class__ is bytes:
                    run.append(item)
                    continue
                if run:
                    items.append(_Item(commands=b"".join(run)))
                    run = []
                if item.__class__ is _BulkRequest:  # one chunk per message: it ends this one
                    items.append(_Item(request=item.request))
                    bulk = item.bulk
                    break
                items.append(_Item(request=item))
            if run:
                items.append(_Item(commands=b"".join(run)))
            if self.log.observed and self.ring is None:  # with the ring, sites go through it
                with self._lock:
                    seqs, names = self.log.unsent_sites()
                message = _ClientMessage(items=items, site_seqs=seqs, sites=names)
            else:
                message = _ClientMessage(items=items)
            yield message if bulk is None else wire.client_message(message, bulk)

    def start_sending_sites(self) -> None:
        """From the next call on, send each call's site with it (tracing or checking is on);
        nothing more once they are sent."""
        with self._lock:
            if not self.log.observed:
                self.log.observe()

    # ---- receiving ----------------------------------------------------------------------------
    def keep_sites(self, seqs: list[int]) -> None:
        """Keep the call sites of calls a model recorded (CallLog.keep)."""
        with self._lock:
            self.log.keep(seqs)

    def forget_sites(self, seqs: list[int]) -> None:
        with self._lock:
            self.log.forget(seqs)

    def expect_notice(self, count: int = 1) -> None:
        """`count` host callbacks were queued: their notices must be read even if no call
        waits (negative: that many will not come, their calls were captured)."""
        self._reader.expect_notice(count)

    def _read_turn(self) -> None:
        """Read one message in the reader role (taken by the caller), then give the role up."""
        try:
            self._read_one()
        finally:
            self._reader.release()

    def _read_one(self) -> None:
        """Read and dispatch one ServerMessage (the caller holds the reader role)."""
        if self._broken is not None:
            return
        try:
            message = next(self._call)
        except StopIteration:
            self._fail_all(
                codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR,
                f"the simnpu daemon at {self.address} closed the session",
            )
            return
        except grpc.RpcError as error:
            self._fail_all(*describe_rpc_error(self.address, error))
            return
        for reply in message.replies:
            pending = self._replies.pop(reply.id, None)
            if pending is not None:
                pending.reply = reply
                pending.event.set()
                if pending.slot >= 0:  # it asked for the mailbox and sleeps on the doorbell
                    assert self.mailbox is not None  # slots exist once use_notify made it
                    self.mailbox.area.wake_doorbell()
        for notice in message.notices:
            if notice.kind == npu_pb2.Notice.KIND_HOST_CALLBACK:
                self._reader.notice_arrived()
                if self.on_callback:
                    self.on_callback(notice.callback)
            elif notice.kind == npu_pb2.Notice.KIND_DEVICE_GONE:
                self._fail_all(
                    codes.ACL_ERROR_RT_DRV_INTERNAL_ERROR,
                    f"the simnpu daemon at {self.address} is gone: {notice.message}",
                )

    def _receive(self) -> None:
        """The background reader: reads while notices are due, replies come through the
        mailbox, or the session closes."""
        while self._reader.claim_in_background(self._is_broken, self._always_read):
            self._read_turn()

    def _is_broken(self) -> bool:
        return self._broken is not None

    def _always_read(self) -> bool:
        return self._closing or self.mailbox is not None

    def _fail_all(self, code: int, message: str) -> None:
        if self._broken is None:  # before the lock: a call waiting for room in the ring holds it
            self._broken = NpuError(code, message)
        with self._lock:
            pending, self._replies = list(self._replies.values()), {}
        for item in pending:
            item.reply = self._broken
            item.event.set()
        if self.mailbox is not None:  # mailbox waiters look at their events again
            self.mailbox.area.wake_doorbell()
        self._reader.wake()

    @property
    def broken(self) -> NpuError | None:
        return self._broken

    def close(self) -> None:
        """End the session: the daemon frees everything it still owned. Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        self._reader.wake()  # the background reader drains the stream to its end
        try:
            self._receiver.join(5)
        finally:
            self._call.cancel()
            self._channel.close()
