"""A client session: the handles a client process owns, and the decoding of its messages.

One Session per gRPC Session stream. Its reader thread calls `handle_message` for each
ClientMessage -- or, once the client uses its submission ring (docs/fast-path.md), the
ring thread calls `handle_ring` for what the client wrote there; work for the scheduler is
collected in order and posted once per message or ring piece. Replies go to the client's
mailbox slot or to `outbox`, which the gRPC response stream drains. When the stream ends
for any reason, `close` frees everything the session owned once its in-flight work is done.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue

from simnpu.proto import codes, commands, npu_pb2
from simnpu.proto.errors import NpuError, NpuMemoryError, bad_handle, invalid
from simnpu.proto.kernel_abi import discover_kernels
from simnpu.server import observe
from simnpu.server.objects import (
    COLLECTIVE,
    COPY,
    HOST,
    KERNEL,
    MEMSET,
    RECORD,
    RESET,
    WAIT,
    Context,
    DeviceArgs,
    Event,
    Stream,
    Task,
    Waiter,
)
from simnpu.server.resources import Binary, Function, Pinned
from simnpu.server.sentinels import CLOSED, DEFERRED
from simnpu.server.session_staged import SessionStaged, reply_with
from simnpu.server.session_memory import MEMORY_OPS, SessionMemory
from simnpu.server.session_fastpath import SessionFastPath
from simnpu.server.session_streams import SessionStreams
from simnpu.shm.addresses import is_device_address, split_device_address
from simnpu.shm.region import Region, segment_name, shm_available_bytes

log = logging.getLogger("simnpu.session")

IMMEDIATE_PRIORITY = -1  # synchronous copies jump every stream queue, as aclrtMemcpy does
_PROBE_BYTES = 16
# how many arguments each request needs (simnpu.proto.commands.REQUEST_ARGS; HELLO's are optional)
_ARG_COUNTS = {npu_pb2.Op.Value(f"OP_{name}"): len(args)
               for name, args in commands.REQUEST_ARGS.items() if name != "HELLO"}


class Session(SessionStreams, SessionMemory, SessionFastPath, SessionStaged):
    def __init__(self, daemon, session_id: int, peer: str):
        self.daemon = daemon
        self.scheduler = daemon.scheduler
        self.id = session_id
        self.peer = peer
        self.pid = 0
        self.process_name = "?"
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.seq = 0
        self.handles: dict[int, object] = {}
        self._handle_ids = itertools.count(1)
        self.contexts: list[Context] = []
        self.allocations: dict[int, int] = {}  # device address -> device index
        self.immediate: dict[int, Stream] = {}  # device -> hidden stream of synchronous copies
        self.staging: Region | None = None
        self.bulk: memoryview | None = None  # the bulk bytes of the message being handled
        self.submit_failure: NpuError | None = None
        self.waiting_callbacks: dict[int, Task] = {}  # blocking host callbacks (scheduler thread)
        self.op_timeout_s: float | None = None
        self.closed = False
        self._batch: list = []
        self._handlers = {
            npu_pb2.OP_HELLO: self._hello,
            npu_pb2.OP_CREATE_CONTEXT: self._create_context,
            npu_pb2.OP_DESTROY_CONTEXT: self._destroy_context,
            npu_pb2.OP_SYNCHRONIZE_DEVICE: self._synchronize_device,
            npu_pb2.OP_CREATE_STREAM: self._create_stream,
            npu_pb2.OP_DESTROY_STREAM: self._destroy_stream,
            npu_pb2.OP_SYNCHRONIZE_STREAM: self._synchronize_stream,
            npu_pb2.OP_QUERY_STREAM: self._query_stream,
            npu_pb2.OP_SET_STREAM_FAILURE_MODE: self._set_stream_failure_mode,
            npu_pb2.OP_CREATE_EVENT: self._create_event,
            npu_pb2.OP_DESTROY_EVENT: self._destroy_event,
            npu_pb2.OP_QUERY_EVENT: self._query_event,
            npu_pb2.OP_SYNCHRONIZE_EVENT: self._synchronize_event,
            npu_pb2.OP_EVENT_ELAPSED_TIME: self._event_elapsed_time,
            npu_pb2.OP_MALLOC_HOST: self._malloc_host,
            npu_pb2.OP_FREE_HOST: self._free_host,
            npu_pb2.OP_MEMCPY: self._memcpy,
            npu_pb2.OP_MEMSET: self._memset,
            npu_pb2.OP_BINARY_LOAD: self._binary_load,
            npu_pb2.OP_BINARY_UNLOAD: self._binary_unload,
            npu_pb2.OP_GET_FUNCTION: self._get_function,
            npu_pb2.OP_SET_OP_EXECUTE_TIMEOUT: self._set_op_execute_timeout,
            npu_pb2.OP_USE_RING: self._use_ring,
        }
        self._init_memory()
        self._init_fast_path()
        self._handlers.update({op: getattr(self, name) for op, name in MEMORY_OPS.items()})
        self._handlers.update(self.scheduler.collectives.handlers(self))  # HCCL requests
        self._handlers.update(observe.handlers(self))  # tracing and checking (server/observe.py)
        self._handlers.update(daemon.jobs.handlers(self))  # job rendezvous (server/rendezvous.py)
        self.handles[commands.BUILTIN_BINARY] = daemon.builtin_binary

    def __repr__(self) -> str:
        return f"session {self.id} (pid {self.pid} {self.process_name})"

    # ---- messages ---------------------------------------------------------------------------
    def handle_message(self, message: npu_pb2.ClientMessage, bulk: memoryview | None = None
                       ) -> None:
        """Execute one ClientMessage's items in order (reader thread); `bulk` is its bulk
        bytes, which an inline MEMCPY request of it takes (server/session_staged.py). With
        the ring in use the items are only requests too big for it, which the ring thread
        takes in its order (a client with a ring never sends bulk bytes)."""
        if self.ring_reader is not None:
            for item in message.items:
                self.ring_reader.stream_items.put(item)
            return
        if message.site_seqs and self.daemon.observer is not None:  # an observed client's call sites
            self.daemon.observer.sites(self, message.site_seqs, message.sites)
        self.bulk = bulk
        for item in message.items:
            self._handle_item(item)
        self.bulk = None
        self._flush()

    def _flush(self) -> None:
        """Post the scheduler work collected so far."""
        if self._batch:
            batch, self._batch = self._batch, []
            self.scheduler.post(batch)

    def _handle_item(self, item: npu_pb2.Item) -> None:
        if item.HasField("request"):
            self._handle_request(item.request)
        else:
            self._handle_commands(item.commands)

    def _handle_commands(self, buffer: bytes) -> None:
        try:
            for command in commands.decode(buffer):
                self._handle_command(command)
        except NpuError as error:  # a malformed buffer: the rest of it is lost
            self._defer_failure(error)

    def _handle_command(self, command) -> None:
        self.seq += 1
        try:
            self._submit(command)
        except NpuError as error:
            self._defer_failure(error)

    def _defer_failure(self, error: NpuError) -> None:
        """An asynchronous call that the daemon rejected: reported at the next synchronize."""
        log.info("%r: rejected asynchronous call %d: %s", self, self.seq, error)
        if self.submit_failure is None:
            self.submit_failure = NpuError(error.code, f"{error.message} (task {self.seq})")
            self.submit_failure.seq = self.seq
        self._batch.append((self.rejected, (self.seq,)))  # server/session_fastpath.py

    def _handle_request(self, request: npu_pb2.Request) -> None:
        self.seq += 1
        if request.mailbox:
            self._note_mailbox(request)
        handler = self._handlers.get(request.op)
        try:
            if handler is None:
                raise invalid(f"unknown request op {request.op}")
            if len(request.args) < _ARG_COUNTS.get(request.op, 0):
                raise invalid(f"{npu_pb2.Op.Name(request.op)} takes {_ARG_COUNTS[request.op]} arguments, "
                              f"got {len(request.args)}")
            result = handler(request)
        except NpuError as error:
            if request.id:
                self.respond(request.id, error.code, error.message)
            else:  # nobody waits for this reply (an aclrtFree): report at the next synchronize
                self._defer_failure(error)
            return
        except Exception as error:  # a bug of ours: the client gets a code, the daemon lives
            log.exception("%r: request %s failed", self, npu_pb2.Op.Name(request.op) if request.op in npu_pb2.Op.values() else request.op)
            self.respond(request.id, codes.ACL_ERROR_RT_INTERNAL_ERROR, f"internal error: {error!r}")
            return
        if result is DEFERRED:
            return
        if isinstance(result, npu_pb2.Reply):
            result.id = request.id
            self._send(result)
        else:
            self.respond(request.id, 0, values=result or ())

    def respond(self, request_id: int, code: int = 0, message: str = "", values=(), text: str = "",
                data: bytes = b"", task_seq: int = 0) -> None:
        """Queue the reply to request `request_id` (any thread)."""
        if request_id:
            self._send(npu_pb2.Reply(id=request_id, code=code, message=message, values=values,
                                     text=text, data=data, task_seq=task_seq))

    def _send(self, reply: npu_pb2.Reply) -> None:
        if not self._mailbox_of or not self._post_reply(reply):  # server/session_fastpath.py
            self.outbox.put(reply)

    def respond_failure(self, request_id: int, failure) -> None:
        if failure is None:
            self.respond(request_id)
        else:
            self.respond(request_id, failure.code, failure.message, task_seq=failure.seq)

    # ---- handles -------------------------------------------------------------------------------
    def _new_handle(self, obj, kind: int) -> int:
        handle = (kind << 40) | next(self._handle_ids)
        self.handles[handle] = obj
        return handle

    def _get(self, handle: int, cls, kind: str):
        obj = self.handles.get(handle)
        if not isinstance(obj, cls):
            raise bad_handle(kind, handle)
        return obj

    def _stream(self, handle: int) -> Stream:
        return self._get(handle, Stream, "stream")

    def _event(self, handle: int) -> Event:
        return self._get(handle, Event, "event")

    def _context(self, handle: int) -> Context:
        return self._get(handle, Context, "context")

    def _device(self, index: int):
        if not 0 <= index < len(self.daemon.devices):
            raise NpuError(codes.ACL_ERROR_RT_INVALID_DEVICEID,
                           f"device {index} does not exist (this daemon simulates {len(self.daemon.devices)})")
        return self.daemon.devices[index]

    # ---- asynchronous commands -------------------------------------------------------------------
    def _submit(self, command) -> None:
        kind = type(command)
        if kind is commands.Launch:
            function = self._get(command.function, Function, "function")
            values = function.signature.unpack(command.args)
            self._queue_launch(command.stream, function, command.num_blocks, values)
        elif kind is commands.Copy:
            stream = self._stream(command.stream)
            self._queue(stream, COPY, self._copy_payload(command.dst, command.src, command.count))
        elif kind is commands.Memset:
            stream = self._stream(command.stream)
            dst = self._resolve(command.dst, command.count)
            self._queue(stream, MEMSET, (dst, command.value & 0xFF, command.count))
        elif kind is commands.EventCommand:
            event, stream = self._event(command.event), self._stream(command.stream)
            task_kind = {commands.CMD_RECORD_EVENT: RECORD, commands.CMD_RESET_EVENT: RESET,
                         commands.CMD_WAIT_EVENT: WAIT}[command.op]
            self._queue(stream, task_kind, (event,))
        elif kind is commands.HostCallback:
            if command.op == commands.CMD_HOST_CALLBACK:
                self._queue(self._stream(command.stream), HOST, (command.callback, bool(command.blocking)))
            else:  # by callback id: the stream may be being destroyed (its handle already gone)
                self._batch.append((self._host_done, (command.callback,)))
        elif kind is commands.Collective:
            payload = self.scheduler.collectives.payload(self, command)
            self._queue(self._stream(command.stream), COLLECTIVE, payload)
        elif kind is commands.LaunchDevArgs:
            function = self._get(command.function, Function, "function")
            address, size = command.args_ptr, command.args_size
            self._device_range(address, size)  # checked now, read when the launch runs
            self._queue_launch(command.stream, function, command.num_blocks,
                               DeviceArgs(lambda: self._device_args(function, address, size)))

    def run_host_callback(self, callback: int, blocking_task: Task | None) -> None:
        """Ask the client to run host callback `callback` now (scheduler thread); a blocking
        one holds its stream until the client says it is done."""
        if blocking_task is not None:
            self.waiting_callbacks[callback] = blocking_task
        self.outbox.put(npu_pb2.Notice(kind=npu_pb2.Notice.KIND_HOST_CALLBACK, callback=callback))

    def _host_done(self, callback: int) -> None:
        task = self.waiting_callbacks.pop(callback, None)
        if task is not None:
            self.scheduler.host_done(task)

    def _queue(self, stream: Stream, kind: str, payload: tuple) -> None:
        self._batch.append((self.scheduler.submit, (Task(self.seq, kind, stream, payload),)))

    def _queue_launch(self, stream_handle: int, function: Function, num_blocks: int, values) -> None:
        stream = self._stream(stream_handle)
        if num_blocks <= 0:
            raise invalid("numBlocks must be at least 1")
        bounds = None if isinstance(values, DeviceArgs) else self._bounds(function, values)
        self._queue(stream, KERNEL, (function.binary, function.name, values, num_blocks, bounds))

    def _bounds(self, function: Function, values: tuple) -> tuple:
        """The allocations a kernel may touch: this session's, passed to it as pointers."""
        bounds = []
        for kind, value in zip(function.signature.types, values):
            if kind == "ptr" and value:
                allocation = self._own_allocation(value)
                if allocation is not None:
                    bounds.append(allocation)
        return tuple(bounds)

    def _device_args(self, function: Function, address: int, size: int) -> tuple:
        """(values, bounds) of launch arguments in device memory, read now (scheduler)."""
        values = function.signature.unpack(self._read_device(address, size))
        return values, self._bounds(function, values)

    def _allocation_at(self, address: int):
        """The live allocation (of any session) holding device address `address`, if any."""
        if not is_device_address(address):
            return None
        device_index, _ = split_device_address(address)
        if device_index >= len(self.daemon.devices):
            return None
        return self.daemon.devices[device_index].lookup(address)

    def _own_allocation(self, address: int):
        """(start address, requested size) of this session's allocation holding `address`."""
        allocation = self._allocation_at(address)
        if allocation is None:
            return None
        if allocation.owner is not self:
            return self.imported_range(address) if self.imported else None  # IPC memory
        start = address - (split_device_address(address)[1] - allocation.offset)
        return start, allocation.size

    def _read_device(self, address: int, size: int) -> bytes:
        device, offset = self._device_range(address, size)
        return bytes(device.region.map[offset:offset + size])

    def _device_range(self, address: int, count: int):
        found = self._own_allocation(address)
        if found is None:
            raise invalid(f"{address:#x} is not inside a device allocation of this process")
        start, size = found
        if address + count > start + size:
            raise invalid(f"{count} bytes at {address:#x} run past the end of its allocation "
                          f"[{start:#x}, +{size})")
        device_index, offset = split_device_address(address)
        return self.daemon.devices[device_index], offset

    def _resolve(self, location: commands.Location, count: int) -> tuple:
        """A wire location turned into what a copy engine maps: ("dev"|"seg", key, offset)."""
        space, ident, offset = location
        if count < 0:
            raise invalid(f"negative byte count {count}")
        if space == commands.SPACE_DEVICE:
            device, device_offset = self._device_range(offset, count)
            return ("dev", device.index, device_offset)
        if space == commands.SPACE_PINNED:
            region = self._get(ident, Pinned, "pinned host memory").region
        elif space == commands.SPACE_STAGING and self.staging is not None:
            region = self.staging
        else:
            raise invalid(f"unknown memory space {space}")
        if offset < 0 or count < 0 or offset + count > _data_size(region, self):
            raise invalid(f"{count} bytes at offset {offset} exceed the host buffer of {region.size} bytes")
        return ("seg", region.name, offset)

    def _copy_payload(self, dst, src, count) -> tuple:
        return (self._resolve(dst, count), self._resolve(src, count), count)

    # ---- requests ------------------------------------------------------------------------------------
    def _hello(self, request):
        self.pid, memory_limit = (list(request.args) + [0, 0])[:2]
        self.process_name = request.text or "?"
        if memory_limit > 0:  # the client's SIMNPU_MEMORY_LIMIT (server/quotas.py)
            self.memory_limits.set(None, memory_limit)
        config = self.daemon.config
        if self.staging is None:
            self.staging = Region.create(segment_name(f"s{self.id}", "staging"),
                                         config.staging_bytes + _PROBE_BYTES)
        probe = os.urandom(_PROBE_BYTES)
        self.staging.map[config.staging_bytes:config.staging_bytes + _PROBE_BYTES] = probe
        names = [self.staging.name, *self._create_fast_path()]  # server/session_fastpath.py
        return npu_pb2.Reply(values=[self.id, len(self.daemon.devices), config.staging_bytes,
                                     config.ai_cores, config.copy_engines, observe.hello_flags(self)],
                             text="\n".join(names), data=probe)

    def _owner_of(self, address: int):
        """Another session owning the allocation at `address` (for error messages), if any."""
        allocation = self._allocation_at(address)
        return None if allocation is None or allocation.owner is self else allocation.owner

    def _malloc_host(self, request):
        size = request.args[0]
        if size <= 0:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"cannot allocate {size} bytes of host memory")
        available = shm_available_bytes()
        if size > available:
            raise NpuMemoryError(f"cannot allocate {size} bytes of pinned host memory: "
                                 f"/dev/shm has {available} bytes free")
        try:
            region = Region.create(segment_name(f"s{self.id}", f"pin{next(self._handle_ids)}"), size)
        except (OSError, ValueError, OverflowError) as error:
            raise NpuMemoryError(f"cannot allocate {size} bytes of pinned host memory: {error}")
        handle = self._new_handle(Pinned(region), 6)
        return npu_pb2.Reply(values=[handle, size], text=region.name)

    def _free_host(self, request):
        pinned = self._get(request.args[0], Pinned, "pinned host memory")
        del self.handles[request.args[0]]
        self._release_segment(pinned.region)
        return []

    def _release_segment(self, region: Region) -> None:
        region.close()
        self.scheduler.call(self.daemon.forget_segment, region.name)

    def _immediate_stream(self, device_index: int) -> Stream:
        stream = self.immediate.get(device_index)
        if stream is None:
            context = Context(0, device_index, self)
            stream = self.immediate[device_index] = Stream(0, context, IMMEDIATE_PRIORITY)
            context.streams.append(stream)
        return stream

    def _memcpy(self, request):
        args = request.args
        if len(args) != 9:
            raise invalid("MEMCPY takes 9 arguments")
        stream_handle, count, inline = args[0], args[7], args[8]
        dst = commands.Location(*args[1:4])
        src = commands.Location(*args[4:7])
        payload = self._copy_payload(dst, src, count)
        if commands.SPACE_STAGING in (dst.space, src.space):  # a chunk of a pageable copy
            return self._staged_copy(request.id, stream_handle, dst, src, payload, bool(inline))
        self._queue_answered(request.id, stream_handle, COPY, payload, None)
        return DEFERRED

    def _memset(self, request):
        args = request.args
        if len(args) != 6:
            raise invalid("MEMSET takes 6 arguments")
        dst = commands.Location(*args[1:4])
        payload = (self._resolve(dst, args[5]), args[4] & 0xFF, args[5])
        self._queue_answered(request.id, args[0], MEMSET, payload, None)
        return DEFERRED

    def _queue_answered(self, request_id, stream_handle, kind, payload, read_back) -> None:
        """Queue a copy or memset and reply when it has run (synchronous ACL calls)."""
        if stream_handle == commands.IMMEDIATE:
            location = payload[0] if payload[0][0] == "dev" else payload[1]
            device_index = location[1] if location[0] == "dev" else 0
            stream = self._immediate_stream(device_index)
        else:
            stream = self._stream(stream_handle)
        task = Task(self.seq, kind, stream, payload)

        def finish(timed_out: bool) -> None:
            if stream.priority == IMMEDIATE_PRIORITY:
                stream.failure = None
            if task.failure is not None:
                self.respond_failure(request_id, task.failure)
            elif read_back is not None and request_id:  # inline, to the host: back as bulk
                offset, count = read_back
                self.outbox.put(reply_with(request_id, self.staging.map, offset, count))
            else:
                self.respond(request_id)

        def begin():
            self.scheduler.submit(task)
            self.scheduler.watch(Waiter(lambda: task.state == 2, finish), tasks=[task])

        self._batch.append((begin, ()))

    def _binary_load(self, request):
        source, filename = request.text, request.data.decode("utf-8", "replace") or "<kernel module>"
        try:
            kernels = discover_kernels(source, filename)
        except (SyntaxError, ValueError) as error:
            raise NpuError(codes.ACL_ERROR_INVALID_FILE, f"cannot load kernel module {filename}: {error}")
        binary = Binary(self.daemon.next_binary_id(), source, filename, kernels)
        return [self._new_handle(binary, 4)]

    def _binary_unload(self, request):
        binary = self._get(request.args[0], Binary, "binary")
        if request.args[0] == commands.BUILTIN_BINARY:
            raise invalid("the built-in kernel library cannot be unloaded")
        for handle, obj in list(self.handles.items()):
            if obj is binary or (isinstance(obj, Function) and obj.binary is binary):
                del self.handles[handle]
        return []

    def _get_function(self, request):
        binary = self._get(request.args[0], Binary, "binary")
        signature = binary.kernels.get(request.text)
        if signature is None:
            raise NpuError(codes.ACL_ERROR_RT_KERNEL_LOOKUP,
                           f"no kernel named {request.text!r} in {binary.filename} "
                           f"(it has: {', '.join(sorted(binary.kernels)) or 'none'})")
        handle = self._new_handle(Function(binary, request.text, signature), 5)
        return npu_pb2.Reply(values=[handle], text=signature.to_wire())

    def _set_op_execute_timeout(self, request):
        milliseconds = request.args[0]
        if milliseconds < 0:
            raise invalid("the operator execution timeout cannot be negative")
        self.op_timeout_s = milliseconds / 1000.0 if milliseconds else None
        return []

    # ---- the end -------------------------------------------------------------------------------------------
    def abandon(self, why: str) -> None:
        """End the session from the daemon's side (the client broke the protocol)."""
        self.outbox.put(npu_pb2.Notice(kind=npu_pb2.Notice.KIND_DEVICE_GONE,
                                       message=f"the daemon ended this session: {why}"))
        self.outbox.put(CLOSED)

    def close(self, on_closed) -> None:
        """The client is gone: drop its queued work, wait for what is running, free all."""
        if self.closed:
            return
        self.closed = True
        self._stop_ring()  # nothing more is taken from the submission ring
        streams = [s for c in self.contexts for s in c.streams] + list(self.immediate.values())

        def begin():
            self.scheduler.collectives.session_closed(self)  # its ranks are gone: peers must not wait
            for stream in streams:
                self.scheduler.drop_pending(stream)
            for task in list(self.waiting_callbacks.values()):  # nobody is left to run them
                self.scheduler.host_done(task)
            self.waiting_callbacks.clear()
            waiter = Waiter(lambda: all(not s.tasks for s in streams), lambda timed_out: finish())
            self.scheduler.watch(waiter, streams=streams)

        def finish():
            try:
                if self.daemon.observer is not None:  # leaks, then forget its timeline/checks
                    self.daemon.observer.session_closed(self)
                self.release_all()
            finally:
                on_closed(self)

        self.scheduler.call(begin)

    def release_all(self) -> None:
        """Free device memory, pinned segments, the staging area and the fast path's
        segments; forget the counts."""
        self._stop_ring()
        self.release_memory()  # server/session_memory.py: IPC-aware
        for context in self.contexts:
            self.daemon.count_stream(context.device, -len(context.streams))
        for handle, obj in list(self.handles.items()):
            if isinstance(obj, Pinned):
                self._release_segment(obj.region)
            elif isinstance(obj, Event):
                self.daemon.count_event(obj.context.device, -1)
        self.handles.clear()
        if self.staging is not None:
            self._release_segment(self.staging)
            self.staging = None
        self._release_fast_path()

    def memory_in_use(self) -> int:
        total = 0
        for address, device_index in list(self.allocations.items()):
            allocation = self.daemon.devices[device_index].lookup(address)
            if allocation is not None:
                total += allocation.reserved
        return total


def _data_size(region: Region, session: Session) -> int:
    """Usable bytes of a host segment (the staging area ends with the probe bytes)."""
    if region is session.staging:
        return session.daemon.config.staging_bytes
    return region.size
