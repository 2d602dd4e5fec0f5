"""Packed asynchronous command records, and the argument lists of requests.

Asynchronous calls (launch, memcpy_async, memset_async, record/reset/wait event, HCCL
collectives) never get a reply, so they travel as fixed-layout little-endian records
packed back to back in Item.commands: a 2-byte op code, the op's fixed fields, and for
launches the argument buffer. Packing one costs a single struct call on the client;
decoding walks the buffer.

A memory location in a copy or memset is (space, id, offset):
  SPACE_DEVICE  - id unused, offset is the absolute device address
  SPACE_PINNED  - id is the pinned segment's handle, offset is within it
  SPACE_STAGING - id unused, offset is within the session's staging area
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

SPACE_DEVICE = 0
SPACE_PINNED = 1
SPACE_STAGING = 2

CMD_LAUNCH = 1          # host arguments follow the record
CMD_LAUNCH_DEVARGS = 2  # arguments in device memory (aclrtLaunchKernel)
CMD_COPY = 3
CMD_MEMSET = 4
CMD_RECORD_EVENT = 5
CMD_RESET_EVENT = 6
CMD_WAIT_EVENT = 7
CMD_HOST_CALLBACK = 8   # run a host callback in the client when the stream reaches it
CMD_HOST_DONE = 9       # the client finished a blocking host callback
CMD_COLLECTIVE = 16     # an HCCL collective or send/recv on a communicator (simnpu.proto.hccl_types)
# Only in a submission ring (simnpu.shm.ring, docs/fast-path.md), where requests travel too:
CMD_RING_REQUEST = 32      # a serialized Request follows (u32 length, then the bytes)
CMD_RING_STREAM_ITEM = 33  # the next Item of the gRPC stream goes here (too big for the ring)
CMD_RING_SITE = 34         # the call site of this and the following calls (u32 length, UTF-8 text)
CMD_RING_END = 35          # nothing more before the end of the ring's data

_OP = struct.Struct("<H")
LAUNCH = struct.Struct("<HIQQI")          # op, num_blocks, stream, function, args_len
LAUNCH_DEVARGS = struct.Struct("<HIQQQI")  # op, num_blocks, stream, function, args_ptr, args_size
COPY = struct.Struct("<HQBQQBQQQ")        # op, stream, dst(space, id, off), src(space, id, off), count
MEMSET = struct.Struct("<HQBQQBQ")        # op, stream, dst(space, id, off), value, count
EVENT = struct.Struct("<HQQ")             # op, event, stream (record / reset / wait alike)
HOST = struct.Struct("<HQQB")             # op, stream, callback id, blocking (callback; done: 0)
# op, stream, comm, HcclCMDType, send ptr, recv ptr, count, recv count, HcclDataType, recv data
# type, HcclReduceOp, root / peer rank
COLLECTIVE = struct.Struct("<HQQHQQQQHHHI")
RING_BYTES = struct.Struct("<HI")         # op, length of what follows (a request, a site)

_FIXED = {
    CMD_LAUNCH: LAUNCH,
    CMD_LAUNCH_DEVARGS: LAUNCH_DEVARGS,
    CMD_COPY: COPY,
    CMD_MEMSET: MEMSET,
    CMD_RECORD_EVENT: EVENT,
    CMD_RESET_EVENT: EVENT,
    CMD_WAIT_EVENT: EVENT,
    CMD_HOST_CALLBACK: HOST,
    CMD_HOST_DONE: HOST,
    CMD_COLLECTIVE: COLLECTIVE,
}
_RING_FIXED = {**_FIXED, CMD_RING_REQUEST: RING_BYTES, CMD_RING_SITE: RING_BYTES,
               CMD_RING_STREAM_ITEM: _OP, CMD_RING_END: _OP}


class HostCallback(NamedTuple):
    op: int
    stream: int
    callback: int
    blocking: int


class Collective(NamedTuple):
    stream: int
    comm: int
    kind: int        # HcclCMDType
    send: int
    recv: int
    count: int
    recv_count: int  # alltoall's recvCount; otherwise equal to count
    dtype: int       # HcclDataType
    recv_dtype: int  # alltoall's recvType; otherwise equal to dtype
    op: int          # HcclReduceOp (reducing collectives)
    root: int        # root rank (broadcast, reduce), peer rank (send, recv)


class Location(NamedTuple):
    space: int
    id: int
    offset: int


class Launch(NamedTuple):
    num_blocks: int
    stream: int
    function: int
    args: bytes


class LaunchDevArgs(NamedTuple):
    num_blocks: int
    stream: int
    function: int
    args_ptr: int
    args_size: int


class Copy(NamedTuple):
    stream: int
    dst: Location
    src: Location
    count: int


class Memset(NamedTuple):
    stream: int
    dst: Location
    value: int
    count: int


class EventCommand(NamedTuple):
    op: int
    event: int
    stream: int


class RingRequest(NamedTuple):
    request: bytes  # a serialized Request


class RingSite(NamedTuple):
    site: str  # file:line of the next call and those after it, until the next RingSite


class StreamItem(NamedTuple):
    pass


def pack_launch(num_blocks: int, stream: int, function: int, args: bytes) -> bytes:
    return LAUNCH.pack(CMD_LAUNCH, num_blocks, stream, function, len(args)) + args


def pack_launch_devargs(num_blocks: int, stream: int, function: int, args_ptr: int, size: int) -> bytes:
    return LAUNCH_DEVARGS.pack(CMD_LAUNCH_DEVARGS, num_blocks, stream, function, args_ptr, size)


def pack_copy(stream: int, dst: Location, src: Location, count: int) -> bytes:
    return COPY.pack(CMD_COPY, stream, *dst, *src, count)


def pack_memset(stream: int, dst: Location, value: int, count: int) -> bytes:
    return MEMSET.pack(CMD_MEMSET, stream, *dst, value, count)


def pack_event(op: int, event: int, stream: int) -> bytes:
    return EVENT.pack(op, event, stream)


def pack_host(op: int, stream: int, callback: int, blocking: bool) -> bytes:
    return HOST.pack(op, stream, callback, int(blocking))


def pack_collective(call: Collective) -> bytes:
    return COLLECTIVE.pack(CMD_COLLECTIVE, *call)


def pack_ring_request(request: bytes) -> bytes:
    return RING_BYTES.pack(CMD_RING_REQUEST, len(request)) + request


def pack_ring_site(site: str) -> bytes:
    text = site.encode()
    return RING_BYTES.pack(CMD_RING_SITE, len(text)) + text


STREAM_ITEM = _OP.pack(CMD_RING_STREAM_ITEM)


def decode(buffer: bytes, ring: bool = False) -> Iterator[object]:
    """Yield the commands packed in `buffer`, in order.

    A truncated or unknown record raises NpuError(107000); the records before it have
    already been yielded (and executed), as they would have been on the wire. With
    `ring`, `buffer` is a piece of a submission ring: the CMD_RING_* records are allowed
    too, and CMD_RING_END or fewer than 2 bytes left end it.
    """
    view = memoryview(buffer)
    pos, end = 0, len(view)
    known = _RING_FIXED if ring else _FIXED
    while pos < end:
        if end - pos < _OP.size:
            if ring:
                return
            raise _malformed(f"truncated op code at byte {pos}")
        (op,) = _OP.unpack_from(view, pos)
        layout = known.get(op)
        if layout is None:
            raise _malformed(f"unknown command op {op} at byte {pos}")
        if end - pos < layout.size:
            raise _malformed(f"truncated command op {op} at byte {pos}")
        fields = layout.unpack_from(view, pos)
        pos += layout.size
        if op == CMD_LAUNCH:
            args_len = fields[4]
            if end - pos < args_len:
                raise _malformed(f"launch arguments truncated at byte {pos}")
            yield Launch(fields[1], fields[2], fields[3], bytes(view[pos:pos + args_len]))
            pos += args_len
        elif op == CMD_LAUNCH_DEVARGS:
            yield LaunchDevArgs(*fields[1:])
        elif op == CMD_COPY:
            yield Copy(fields[1], Location(*fields[2:5]), Location(*fields[5:8]), fields[8])
        elif op == CMD_MEMSET:
            yield Memset(fields[1], Location(*fields[2:5]), fields[5], fields[6])
        elif op in (CMD_HOST_CALLBACK, CMD_HOST_DONE):
            yield HostCallback(*fields)
        elif op == CMD_COLLECTIVE:
            yield Collective(*fields[1:])
        elif op < CMD_RING_REQUEST:
            yield EventCommand(op, fields[1], fields[2])
        elif op == CMD_RING_END:
            return
        elif op == CMD_RING_STREAM_ITEM:
            yield StreamItem()
        else:
            length = fields[1]
            if end - pos < length:
                raise _malformed(f"ring record of {length} bytes truncated at byte {pos}")
            payload = bytes(view[pos:pos + length])
            pos += length
            if op == CMD_RING_REQUEST:
                yield RingRequest(payload)
            else:
                yield RingSite(payload.decode("utf-8", "replace"))


def _malformed(what: str) -> NpuError:
    return NpuError(codes.ACL_ERROR_RT_PARAM_INVALID, f"malformed command buffer: {what}")


# Arguments of each request (Request.args) and what its reply carries (Reply.values).
# IMMEDIATE as a stream means "not stream-ordered" (synchronous aclrtMemcpy / aclrtMemset).
IMMEDIATE = -1
REQUEST_ARGS = {
    # text: process name -> values (session, devices, staging size, AI cores, copy engines,
    # observe flags); text: the staging, notify and ring segment names, a line each; data: probe
    "HELLO": ("pid", "memory_limit"),
    "CREATE_CONTEXT": ("device",),  # -> (context, default stream, its notify slot or -1)
    "DESTROY_CONTEXT": ("context",),
    "SYNCHRONIZE_DEVICE": ("device", "timeout_ms"),
    "CREATE_STREAM": ("context", "priority", "flags"),  # -> (stream, its notify slot or -1)
    "DESTROY_STREAM": ("stream", "force"),
    "SYNCHRONIZE_STREAM": ("stream", "timeout_ms"),
    "QUERY_STREAM": ("stream",),  # -> (aclrtStreamStatus,)
    "SET_STREAM_FAILURE_MODE": ("stream", "mode"),
    "CREATE_EVENT": ("context", "flags"),  # -> (event,)
    "DESTROY_EVENT": ("event",),
    "QUERY_EVENT": ("event",),  # -> (aclrtEventRecordedStatus,)
    "SYNCHRONIZE_EVENT": ("event", "timeout_ms"),
    "EVENT_ELAPSED_TIME": ("start", "end"),  # -> (nanoseconds,)
    "MALLOC": ("device", "size", "policy"),  # -> (device address,)
    "FREE": ("address",),
    "MALLOC_HOST": ("size",),  # -> (segment handle, size); text: segment name
    "FREE_HOST": ("segment",),
    "MEMCPY": ("stream", "dst_space", "dst_id", "dst_offset", "src_space", "src_id", "src_offset",
               "count", "inline"),  # inline=1: the chunk is the message's bulk (proto/bulk.py)
    "MEMSET": ("stream", "dst_space", "dst_id", "dst_offset", "value", "count"),
    "GET_MEM_INFO": ("device",),  # -> (free, total)
    "BINARY_LOAD": (),  # text: source, data: file name -> (binary,)
    "BINARY_UNLOAD": ("binary",),
    "GET_FUNCTION": ("binary",),  # text: name -> (function,); text: signature
    "SET_OP_EXECUTE_TIMEOUT": ("milliseconds",),
    "MEMORY_STATS": ("device",),  # -> text: JSON
    "USE_RING": (),  # later calls come through the submission ring named at HELLO
    "MEMORY_SNAPSHOT": ("device",),  # -> text: JSON
    "MEMORY_LIMIT": ("device", "limit"),  # device -1: all; limit -1: ask -> (limit, used, default)
    "IPC_MEM_EXPORT": ("address", "size", "flags"),  # -> text: key
    "IPC_MEM_SET_IMPORT_PID": ("pid",),  # text: key; args: one or more pids
    "IPC_MEM_IMPORT": ("flags",),  # text: key -> (address, size, device)
    "IPC_MEM_CLOSE": (),  # text: key
    "MEM_POOL_CREATE": ("device", "max_size"),  # -> (pool,)
    "MEM_POOL_DESTROY": ("pool",),
    "MEM_POOL_MALLOC": ("pool", "size", "stream"),  # -> (address,)
    "MEM_POOL_FREE": ("address", "stream"),
    "MEM_POOL_ATTR": ("pool", "attr", "value"),  # value -1: get -> (value,)
    # HCCL: replies carry an HcclResult (simnpu.proto.hccl_types) as their code, not an ACL code
    "HCCL_GET_ROOT_INFO": ("device", "exec_timeout_ms"),  # -> data: root info (4108 bytes)
    "HCCL_COMM_INIT": ("n_ranks", "rank", "device", "connect_timeout_ms"),  # data: root info -> (comm,)
    "HCCL_COMM_DESTROY": ("comm",),
    "HCCL_COMM_ASYNC_ERROR": ("comm",),  # -> (HcclResult,); text: what failed
    # text: job name -> (rank, world_size, formation); data: root info (server/rendezvous.py)
    "HCCL_RENDEZVOUS": ("world_size", "exec_timeout_ms", "timeout_ms"),
    # observability (docs/observability.md): flags are simnpu.proto.observe bits
    "OBSERVE": ("flags",),  # -> (flags in force,)
    "OBSERVE_TRACE": (),  # -> text: Chrome trace JSON of this session
    "OBSERVE_REPORT": ("final",),  # final=1 also lists leaks -> text: JSON findings
}
BUILTIN_BINARY = 1  # handle of the built-in kernel library, present in every session
