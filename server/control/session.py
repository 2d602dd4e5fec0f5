"""A client session: the handles a client process owns, its calls decoded and run in order,
its replies.

One Session per gRPC Session stream. Its reader thread calls `handle_message` for each
ClientMessage -- or, once the client uses its submission ring, the ring thread hands it
what the client wrote there (server/control/session_fast_path.py). Each call takes the next sequence
number and goes to its handler (server/control/handlers/, one module per ACL concept); scheduler
work the handlers queue with `post` is posted once per message or ring piece, in order.
Replies go to the client's mailbox slot or to `outbox`, which the gRPC response stream
drains. When the stream ends for any reason, `close` frees everything the session owned
once its in-flight work is done.

What handlers use of a session (and HCCL, observation and job code too) is the public
part below: its identity, `handles` (the handle table, here because `Handles.get` is on
every call's path), `memory` (its device memory: ClientMemory, whose `device_range` checks
the ranges calls name), the lookups of devices, contexts, streams and events, the streams it
makes and forgets, `post`, `submit` (with the stream whose limits bound a launch, if another),
`answer_in_order`, `when_done`, `respond` and `reject`.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import DecodeError, Message

from simnpu.proto import codes, commands, messages, npu_pb2
from simnpu.proto.errors import NpuError, bad_handle, invalid
from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.control.handlers.registry import HANDLERS, LATER
from simnpu.server.control.session_fast_path import FastPath
from simnpu.server.core.cnt_notifies import CntNotify
from simnpu.server.core.ipc_events import OpenedEvent
from simnpu.server.core.notifies import Notify
from simnpu.server.core.owner import Owner
from simnpu.server.core.streams import Context, Event, Failure, Stream
from simnpu.server.core.tasks import Task, TaskState
from simnpu.server.core.tenants import Tenant
from simnpu.server.core.untrusted import CALL_SITE, cut, escaped
from simnpu.server.core.waiters import Waiter
from simnpu.server.graphs.capture import invalidate_capture
from simnpu.server.memory.client_memory import ClientMemory
from simnpu.server.memory.pinned_memory import Pinned
from simnpu.shm.region import Region
from simnpu.shm.ring import RingCorrupt

if TYPE_CHECKING:
    from simnpu.server.control.daemon import Daemon
    from simnpu.server.core.scheduler import Scheduler
    from simnpu.server.hccl.collectives import Collectives
    from simnpu.server.memory.device_memory import DeviceWithMemory

log = logging.getLogger("simnpu.session")

IMMEDIATE_PRIORITY = -1  # synchronous copies jump every stream queue, as aclrtMemcpy does
RING_BATCH = 1024  # scheduler work is posted at most this many calls at a time from a ring
CLOSED = object()  # the outbox item that ends a session's gRPC response stream
REJECTIONS_LOGGED = 10  # a session's first rejected calls are logged; the rest only counted

T = TypeVar("T")


# ---- its handle table ----------------------------------------------------------------------------
class Handles:
    """Handle -> object of one session (what each handle stands for: handle_kinds.py). Used by
    its own thread and, for a few calls, under the scheduler lock; each entry is set and
    removed atomically. Here, not in a module of its own: `get` is on every call's path."""

    def __init__(self, builtin_binary: object):
        self._objects: dict[int, Any] = {commands.BUILTIN_BINARY: builtin_binary}
        self._numbers = itertools.count(1)

    def add(self, obj: object, kind: HandleKind) -> int:
        handle = (kind << 40) | next(self._numbers)
        self._objects[handle] = obj
        return handle

    def get(self, handle: int, cls: type[T], what: str) -> T:
        """The live object of class `cls` behind `handle`; else 107017 naming `what`."""
        obj = self._objects.get(handle)
        if not isinstance(obj, cls):
            raise bad_handle(what, handle)
        return obj

    def find(self, handle: int, cls: type[T]) -> T | None:
        """The live object of class `cls` behind `handle`, or None."""
        obj = self._objects.get(handle)
        return obj if isinstance(obj, cls) else None

    def handle_of(self, obj: object) -> int:
        """The handle `obj` has in the session (0: none any more)."""
        for handle, known in self.items():
            if known is obj:
                return handle
        return 0

    def remove(self, handle: int) -> Any:
        """Forget `handle` (nothing if it is not known); the object it stood for."""
        return self._objects.pop(handle, None)

    def unique(self) -> int:
        """A number unused in this session (for segment names)."""
        return next(self._numbers)

    def items(self) -> Iterator[tuple[int, Any]]:
        """(handle, object) of every live handle, safe to change while iterating."""
        return iter(list(self._objects.items()))

    def clear(self) -> None:
        self._objects.clear()


# ---- the session ---------------------------------------------------------------------------------
class Session:
    def __init__(self, daemon: Daemon, session_id: int, peer: str, tenant: Tenant):
        self.daemon = daemon
        assert daemon.scheduler is not None, "sessions open once the daemon runs"
        assert daemon.collectives is not None, "sessions open once the daemon runs"
        self.scheduler: Scheduler = daemon.scheduler
        self.collectives: Collectives = daemon.collectives  # HCCL (server/hccl/collectives.py)
        self.id = session_id
        self.peer = peer
        self.tenant = tenant  # whose client it is (server/core/tenants.py)
        self.owner = Owner(session_id, self._announce)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()  # replies, notices, CLOSED
        self.seq = 0  # the sequence number of the call being handled
        self.handles = Handles(daemon.builtin_binary)
        self.memory = ClientMemory(
            self.owner, daemon.devices, daemon.ipc, daemon.config.memory_limit
        )
        self.immediate: dict[int, Stream] = {}  # device -> hidden stream of synchronous copies
        self.staging: Region | None = None  # the pageable copies' staging area (at HELLO)
        self.bulk: memoryview | None = None  # the bulk bytes of the message being handled
        self.fast_path = FastPath(self)
        self._batch: list[tuple[Callable, tuple]] = []
        self._ring_site: str | None = None  # the call site of the calls in the ring, when observed
        self.rejections = 0  # asynchronous calls rejected so far
        self._release_lock = threading.Lock()
        self._released = False  # release_all ran (the session's end and the daemon's may race)

    def __repr__(self) -> str:
        return repr(self.owner)

    @property
    def pid(self) -> int:
        return self.owner.pid

    @property
    def process_name(self) -> str:
        return self.owner.process_name

    @property
    def contexts(self) -> list[Context]:
        return self.owner.contexts

    @property
    def closed(self) -> bool:
        return self.owner.closed

    def streams(self) -> list[Stream]:
        """Every stream of the session, the hidden ones of synchronous copies too."""
        return self.owner.streams() + list(self.immediate.values())

    # ---- messages ---------------------------------------------------------------------------
    def handle_message(
        self, message: npu_pb2.ClientMessage, bulk: memoryview | None = None
    ) -> None:
        """Execute one ClientMessage's items in order (reader thread); `bulk` is its bulk
        bytes, which an inline MemcpyRequest of it takes. With the ring in use the items are
        only requests too big for it, which the ring thread takes in its order."""
        if self.fast_path.takes_stream_items(message.items):
            return
        if message.site_seqs:  # an observed client's call sites, each cut to CALL_SITE
            sites = [cut(site, CALL_SITE) for site in message.sites]
            for subscriber in self.scheduler.subscribers:
                subscriber.sites(self.owner, self.seq, message.site_seqs, sites)
        self.bulk = bulk
        for item in message.items:
            self.handle_item(item)
        self.bulk = None
        self.flush()

    def handle_item(self, item: npu_pb2.Item) -> None:
        if item.HasField("request"):
            self.handle_request(item.request)
            return
        try:
            for record in commands.decode(item.commands):
                self.handle_command(record)
        except NpuError as error:  # a malformed buffer: the rest of it is lost
            self.reject(error)

    def handle_command(self, record: Any) -> None:
        """One asynchronous call: its task is queued, or it is rejected (reported later)."""
        self.seq += 1
        try:
            HANDLERS[type(record)](self, record)
        except NpuError as error:
            self.reject(error)
            stream = self.handles.find(getattr(record, "stream", 0), Stream)
            if stream is not None:  # a call refused on a stream in capture invalidates it
                self.post(invalidate_capture, stream, f"call {self.seq}: {error.message}")

    def handle_request(self, request: npu_pb2.Request) -> None:
        self.seq += 1
        if request.mailbox:
            self.fast_path.note_mailbox(request)
        case = request.WhichOneof("body")
        try:
            if case is None:
                raise invalid("a request with no body this daemon knows (an unknown request)")
            body = getattr(request, case)
            absent = messages.missing(body)
            if absent:
                raise invalid(f"{case} without {', '.join(absent)}")
            result = HANDLERS[type(body)](self, body, request.id)
        except NpuError as error:
            if request.id:
                self.respond(request.id, code=error.code, message=error.message)
            else:  # nobody waits for this reply (an aclrtFree): report at the next synchronize
                self.reject(error)
            return
        except Exception as error:  # a bug of ours: the client gets a code, the daemon lives
            self.owner.lines.exception(log, "%r: request %s failed", self, case)
            self.respond(
                request.id,
                code=codes.ACL_ERROR_RT_INTERNAL_ERROR,
                message=f"internal error: {error!r}",
            )
            return
        if result is not LATER:
            # the calls before this one reach the scheduler before its answer reaches the
            # client: what the client does next (another client told of it, say) comes after
            self.flush()
            self.respond(request.id, result)

    def handle_ring(
        self, pieces: list, next_stream_item: Callable[[], npu_pb2.Item | None]
    ) -> None:
        """Run what the client wrote in its submission ring, in order (the ring thread of
        server/control/session_fast_path.py); `next_stream_item()` is the next request that went by
        the gRPC stream instead (None: the session ended; RingCorrupt: it never came). A malformed
        record ends the session: nothing after it can be found any more (RingCorrupt)."""
        subscribers = self.scheduler.subscribers
        for subscriber in subscribers:  # forget the call sites of what was submitted before
            subscriber.sites(self.owner, self.seq, (), ())
        for piece in pieces:
            try:
                for record in commands.decode(piece, ring=True):
                    kind = type(record)
                    if kind is commands.RingSite:  # this call's and the following calls'
                        self._ring_site = cut(record.site, CALL_SITE) if subscribers else None
                        continue
                    if self._ring_site is not None:
                        for subscriber in subscribers:
                            subscriber.site(self.owner, self.seq + 1, self._ring_site)
                    if kind is commands.RingRequest:
                        self._ring_request(record.request)
                    elif kind is commands.RingStreamItem:
                        self.flush()  # what came before does not wait for the stream
                        item = next_stream_item()
                        if item is None:
                            return
                        self.handle_item(item)
                    else:
                        self.handle_command(record)
                        if len(self._batch) >= RING_BATCH:  # the device starts on these
                            self.flush()  # while the rest is decoded
            except NpuError as error:  # commands.decode: handlers report their own errors
                self.flush()
                raise RingCorrupt(error.message) from None
        self.flush()

    def _ring_request(self, payload: bytes) -> None:
        try:
            request = npu_pb2.Request.FromString(payload)
        except DecodeError:
            self.seq += 1  # it took a sequence number on the client
            self.reject(invalid("a request in the submission ring does not parse"))
            return
        self.handle_request(request)

    # ---- what handlers use -------------------------------------------------------------------
    def post(self, function: Callable, *args: Any) -> None:
        """Run `function(*args)` under the scheduler, in order with this session's other
        calls (at the end of the message or ring piece being handled)."""
        self._batch.append((function, args))

    def submit(self, task: Task, limits_from: Stream | None = None) -> None:
        """Queue `task` on its stream, in order with this session's other calls; a launch of
        a thread using another stream's limits with that stream (`limits_from`)."""
        if limits_from is not None:
            task.limits_from = limits_from
        self._batch.append((self.scheduler.submit, (task,)))

    def answer_in_order(self, reply_to: int, change: Callable[[], Message | None]) -> object:
        """Run `change()` under the scheduler, in order with this session's calls before it,
        and answer `reply_to` with the body it returns or the NpuError it raises. Returns
        LATER, what the request's handler returns."""

        def run() -> None:
            try:
                reply = change()
            except NpuError as error:
                self.respond(reply_to, code=error.code, message=error.message)
                return
            self.respond(reply_to, reply)

        self.post(run)
        return LATER

    def when_done(
        self, task: Task, finish: Callable[[bool], None], until: float | None = None
    ) -> None:
        """Queue `task` under the scheduler, in order with this session's calls, and call
        `finish(timed_out)` once it ran (or at the monotonic time `until`)."""
        scheduler = self.scheduler

        def begin() -> None:
            scheduler.submit(task)
            scheduler.watch(
                Waiter(lambda: task.state == TaskState.DONE, finish, until), tasks=[task]
            )

        self.post(begin)

    def flush(self) -> None:
        """Post the scheduler work queued so far."""
        if self._batch:
            batch, self._batch = self._batch, []
            self.scheduler.post(batch)

    def respond(
        self,
        request_id: int,
        body: Message | None = None,
        code: int = 0,
        message: str = "",
        task_seq: int = 0,
        device_output: str = "",
    ) -> None:
        """Send the reply to request `request_id` (any thread; nothing if it is 0)."""
        if request_id:
            reply = messages.reply(request_id, body, code, message, task_seq, device_output)
            if not self.fast_path.post_reply(reply):
                self.outbox.put(reply)

    def respond_failure(
        self, request_id: int, failure: Failure | None, device_output: str = ""
    ) -> None:
        """Answer with `failure` (a task's, or a rejected call's), or success; with what the
        client's kernels printed either way (a synchronize's)."""
        if failure is None:
            self.respond(request_id, device_output=device_output)
        else:
            self.respond(
                request_id,
                code=failure.code,
                message=failure.message,
                task_seq=failure.seq,
                device_output=device_output,
            )

    def reject(self, error: NpuError) -> None:
        """The asynchronous call being handled was refused: reported at the next synchronize."""
        seq = self.seq
        self.rejections += 1
        if self.rejections <= REJECTIONS_LOGGED:
            self.owner.lines.info(
                log,
                "%r: rejected asynchronous call %d: %s%s",
                self,
                seq,
                escaped(error.message),
                "; its later rejections are only counted"
                if self.rejections == REJECTIONS_LOGGED
                else "",
            )
        if self.owner.rejected is None:
            self.owner.rejected = Failure(error.code, f"{error.message} (task {seq})", seq)
        self._batch.append((self.scheduler.rejected, (self.owner, seq)))

    def device(self, index: int) -> DeviceWithMemory:
        if not 0 <= index < len(self.daemon.devices):
            raise NpuError(
                codes.ACL_ERROR_RT_INVALID_DEVICEID,
                f"device {index} does not exist (this daemon simulates {len(self.daemon.devices)})",
            )
        device = self.daemon.devices[index]
        if not device.started:  # its workers start on first use
            self.daemon.use_device(device)
        return device

    def context(self, handle: int) -> Context:
        return self.handles.get(handle, Context, "context")

    def stream(self, handle: int) -> Stream:
        return self.handles.get(handle, Stream, "stream")

    def event(self, handle: int) -> Event:
        """The event behind `handle`: this client's own, or an IPC event it opened."""
        if handle >> 40 == HandleKind.IPC_EVENT:
            return self.handles.get(handle, OpenedEvent, "event").event
        return self.handles.get(handle, Event, "event")

    def event_context(self, handle: int) -> Context:
        """The context of this client that event `handle` belongs to (an opened IPC event's
        is the one it was opened in, not its exporter's)."""
        if handle >> 40 == HandleKind.IPC_EVENT:
            return self.handles.get(handle, OpenedEvent, "event").context
        return self.event(handle).context

    def new_stream(self, context: Context, priority: int, flags: int) -> Stream:
        """A new stream of `context`, with its completion signal if the client has a fast
        path; 207008 past the client's or the device's limit (server/control/client_limits.py)."""
        self.daemon.limits.add_stream(self.contexts, context.device)
        stream = Stream(0, context, priority, flags)
        stream.handle = self.handles.add(stream, HandleKind.STREAM)
        area = self.owner.signals
        stream.signal = area.new_signal() if area is not None else None
        context.streams.append(stream)
        return stream

    def stream_gone(self, stream: Stream) -> None:
        """A destroyed stream has run its last task: its count and its signal go."""
        self.daemon.limits.streams_gone(stream.device)
        if stream.signal is not None and self.owner.signals is not None:
            self.owner.signals.release_signal(stream.signal)
            stream.signal = None

    def forget_context(self, context: Context) -> list[Stream]:
        """aclrtDestroyContext: the handles of `context`, its streams and its events go now
        (its events' counts and IPC exports too, and the IPC events opened in it); its
        streams, which go once they have run their tasks (`stream_gone`)."""
        self.handles.remove(context.handle)
        self.contexts.remove(context)
        streams = list(context.streams)
        for stream in streams:
            stream.destroyed = True
            self.handles.remove(stream.handle)
        for handle, obj in self.handles.items():
            if isinstance(obj, Event) and obj.context is context:
                self.handles.remove(handle)
                self.daemon.limits.events_gone(context.device)
                self.daemon.ipc_events.withdraw(obj)
            elif isinstance(obj, OpenedEvent) and obj.context is context:
                self.handles.remove(handle)
        return streams

    def immediate_stream(self, device: int) -> Stream:
        """The hidden stream of synchronous copies and memsets on `device` (it orders nothing
        but them)."""
        stream = self.immediate.get(device)
        if stream is None:
            context = Context(0, device, self.owner)
            stream = self.immediate[device] = Stream(0, context, IMMEDIATE_PRIORITY)
            context.streams.append(stream)
        return stream

    def release_segment(self, region: Region) -> None:
        """Unlink a host segment of this session; units drop their mappings of it."""
        region.close()
        self.scheduler.call(self.daemon.forget_segment, region.name)

    def _announce(self, callback: int) -> None:
        """Tell the client to run host callback `callback` now (under the scheduler lock)."""
        self.outbox.put(npu_pb2.Notice(kind=npu_pb2.Notice.KIND_HOST_CALLBACK, callback=callback))

    # ---- the end -------------------------------------------------------------------------------
    def undecodable(self) -> None:
        """A message of the session's stream does not parse: what the client meant is lost
        with it, so the session ends."""
        self.owner.lines.warning(
            log, "%r: a message of its stream does not parse; ending the session", self
        )
        self.abandon("a message it sent does not parse")

    def tally(self) -> str:
        """What the session did, for the daemon's one log line at its end."""
        return f"{self.seq} calls, {self.rejections} rejected"

    def abandon(self, why: str) -> None:
        """End the session from the daemon's side (the client broke the protocol)."""
        self.outbox.put(
            npu_pb2.Notice(
                kind=npu_pb2.Notice.KIND_DEVICE_GONE,
                message=f"the daemon ended this session: {why}",
            )
        )
        self.outbox.put(CLOSED)

    def close(self, on_closed: Callable[[Session], None]) -> None:
        """The client is gone: drop its queued work, end its own kernels, wait for the rest
        of what is running (built-in kernels, copies: bounded), free all."""
        if self.owner.closed:
            return
        self.owner.closed = True
        self.fast_path.stop_ring()  # nothing more is taken from the submission ring
        streams = self.streams()
        scheduler = self.scheduler

        def begin() -> None:
            self.collectives.session_closed(self)  # its ranks are gone: peers must not wait
            if self.daemon.jobs is not None:  # its job arrivals at other hosts' seeds depart
                self.daemon.jobs.session_closed(self)
            for stream in streams:
                scheduler.drop_pending(stream)
            # its own kernels may run for ever (aclrtSetOpExecuteTimeOut): they end now
            self.daemon.kernels.end_owner(self.id, running_too=True)
            for task in list(self.owner.waiting_callbacks.values()):  # nobody is left to run them
                task.returned(scheduler)
            self.owner.waiting_callbacks.clear()
            waiter = Waiter(lambda: all(not s.tasks for s in streams), lambda timed_out: finish())
            scheduler.watch(waiter, streams=streams)

        def finish() -> None:
            try:
                for subscriber in self.scheduler.subscribers:  # leaks, then forget its own
                    subscriber.session_closed(self.owner)
                self.release_all()
            finally:
                on_closed(self)

        scheduler.call(begin)

    def release_all(self) -> None:
        """Free device memory, pinned segments, the staging area and the fast path's
        segments; forget the counts. Once: a second call returns at once."""
        with self._release_lock:
            first, self._released = not self._released, True
        if not first:
            return
        self.fast_path.stop_ring()
        self.daemon.shareable.let_go(self.owner)  # its shareable handles end first
        self.memory.release_all()
        self.daemon.kernels.end_owner(self.id)
        for context in self.contexts:
            self.daemon.limits.streams_gone(context.device, len(context.streams))
        for _, obj in self.handles.items():
            if isinstance(obj, Pinned):
                self.release_segment(obj.region)
            elif isinstance(obj, Event):
                self.daemon.limits.events_gone(obj.context.device)
                self.daemon.ipc_events.withdraw(obj)
            elif isinstance(obj, Notify):
                self.daemon.notifies.release(obj)
            elif isinstance(obj, CntNotify):
                self.daemon.cnt_notifies.release(obj)
        self.handles.clear()
        if self.staging is not None:
            self.release_segment(self.staging)
            self.staging = None
        for stream in self.streams():  # their signals go with the notify area (the scheduler
            stream.signal = None  # may still finish what it was doing with the last task)
        self.fast_path.release()
