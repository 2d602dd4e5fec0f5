"""rt.kernels: kernel binaries and functions (aclrtBinaryLoad*, aclrtBinaryGetFunction),
launches (aclrtLaunchKernel, aclrtLaunchKernelWithHostArgs, aclrtLaunchKernelWithConfig and
its kernel-args handles, `args`: client/runtime/kernel_args.py), the operator timeout, and
the built-in device tasks aclrtReduceAsync (dst = dst (op) src on a copy engine) and
aclrtRandomNumAsync (simnpu's Philox generator: server/units/random_numbers.py).

A launch is one packed command (simnpu.proto.commands) in the session's ring: everything
the host can check -- the function's signature, the blocks, the argument sizes, the stream,
that device ranges lie in allocations of this process -- it checks at once, with the
runtime's codes; the daemon checks it again. A thread that uses another stream's limits
(aclrtUseStreamResInCurrentThread) sends its launches bounded by them.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime.arguments import wire_int
from simnpu.client.runtime.kernel_args import KernelArgs
from simnpu.client.transport import call_site
from simnpu.proto import builtin_tasks, codes, commands
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.builtin_tasks import COUNTER_BYTES, WORD_BYTES, RandomParameter
from simnpu.proto.errors import NotSupportedError, NpuError, bad_handle, check_num_blocks, invalid
from simnpu.shm.addresses import DEVICE_BASE

if TYPE_CHECKING:
    from simnpu.client.runtime.shared import Shared
    from simnpu.client.runtime.streams import ThreadLimits

    # imported by get_function: a session without kernels never needs it
    from simnpu.proto.kernel_abi import KernelSignature

_UNION = {
    "dropout_bitmask_info": ("dropout_ration",),
    "uniform_dis_info": ("min", "max"),
    "normal_dis_info": ("mean", "stddev"),
}
"""The members of aclrtRandomNumFuncParaInfo's paramInfo union and their parameters."""


class Kernels:
    """Kernel and built-in task calls (see the module docstring)."""

    def __init__(self, shared: Shared, limits: ThreadLimits):
        self._calls, self._connection = shared.calls, shared.connection
        self._contexts = contexts = shared.contexts
        self._streams, self._allocations = contexts.streams, shared.allocations
        self._limits = limits
        self._functions: dict[int, KernelSignature] = {}
        self._function_binary: dict[int, int] = {}  # function handle -> its binary
        self._binaries: set[int] = {commands.BUILTIN_BINARY}
        self.args = KernelArgs(self.signature, contexts.stream)  # aclrtKernelArgs* handles

    # ---- binaries and functions ----------------------------------------------------------------
    @records_errors
    def binary_load(
        self, source: str, filename: str = "<kernel module>", site: str | None = None
    ) -> int:
        """aclrtBinaryLoadFromFile/FromData: the source of a Python kernel module. Blocks."""
        request = pb.BinaryLoadRequest(source=source, filename=filename)
        handle = self._calls.request(request, site).binary
        self._binaries.add(handle)
        return handle

    @records_errors
    def binary_unload(self, binary: int, site: str | None = None) -> None:
        """aclrtBinaryUnLoad: its functions become invalid handles. Blocks."""
        if binary not in self._binaries:
            raise bad_handle("binary", binary)
        self._calls.request(pb.BinaryUnloadRequest(binary=binary), site)
        self._binaries.discard(binary)
        for function in [f for f, b in self._function_binary.items() if b == binary]:
            del self._function_binary[function]
            self._functions.pop(function, None)

    @records_errors
    def get_function(self, binary: int, name: str, site: str | None = None) -> int:
        """aclrtBinaryGetFunction: a kernel of the binary, by name. Blocks."""
        if binary not in self._binaries:
            raise bad_handle("binary", binary)
        from simnpu.proto.kernel_abi import KernelSignature

        reply = self._calls.request(pb.GetFunctionRequest(binary=binary, name=name), site)
        self._functions[reply.function] = KernelSignature.from_wire(reply.signature)
        self._function_binary[reply.function] = binary
        return reply.function

    def signature(self, function: int) -> KernelSignature:
        """The declared parameter types of kernel `function` (107017 for another handle)."""
        signature = self._functions.get(function)
        if signature is None:
            raise bad_handle("function", function)
        return signature

    # ---- launches ------------------------------------------------------------------------------
    def _send(self, record: bytes, stream: int, site: str | None) -> None:
        """Send a launch's record; from a thread that uses another stream's limits, as a
        ThreadLimited record: that stream's core limit bounds it."""
        limits = self._limits
        if limits.used:
            limited = limits.stream()
            if limited is not None and limited != stream and limited in self._streams:
                record = commands.ThreadLimited.pack(limited, record)
        self._connection.send_command(record, site or call_site(), stream)

    @records_errors
    def launch_kernel_with_host_args(
        self,
        function: int,
        num_blocks: int,
        stream: int,
        cfg,
        host_args_ptr: int,
        args_size: int,
        place_holders=None,
        place_holder_num: int = 0,
        site: str | None = None,
    ) -> None:
        """aclrtLaunchKernelWithHostArgs (async), as pyACL passes it: the packed argument
        struct lies in host memory at host_args_ptr and is copied before the call returns."""
        signature = self._functions.get(function)
        if (  # a launch every check below would pass: straight to the ring
            signature is not None
            and 0 < num_blocks <= codes.MAX_NUM_BLOCKS
            and args_size >= signature.end
            and host_args_ptr < DEVICE_BASE
            and stream in self._streams
            and not (cfg or place_holders or place_holder_num)
        ):
            end = signature.end
            args_type = _HOST_ARGS.get(end) or _host_args_type(None, None, 0, 0, end)
            args = args_type.from_address(host_args_ptr).raw
            self._send(commands.Launch.pack(num_blocks, stream, function, args), stream, site)
            return
        struct_type = _HOST_ARGS.get(args_size)
        if (
            cfg
            or place_holders
            or place_holder_num
            or host_args_ptr >= DEVICE_BASE
            or struct_type is None
        ):
            struct_type = _host_args_type(
                cfg, place_holders, place_holder_num, host_args_ptr, args_size
            )
        args = struct_type.from_address(host_args_ptr).raw
        self._launch(function, num_blocks, args, stream, site)

    @records_errors
    def launch_kernel(
        self, function: int, num_blocks: int, args: bytes, stream: int, site: str | None = None
    ) -> None:
        """aclrtLaunchKernelWithHostArgs (async): `args` is the packed parameter buffer."""
        self._launch(function, num_blocks, args, stream, site)

    def _launch(
        self, function: int, num_blocks: int, args: bytes, stream: int, site: str | None
    ) -> None:
        signature = self.signature(function)
        check_num_blocks(num_blocks)
        if len(args) < signature.end:
            raise invalid(
                f"argument buffer of {len(args)} bytes is shorter than the {signature.end} "
                f"bytes the kernel's parameters ({signature.to_wire()}) need"
            )
        stream = self._contexts.stream(stream)
        args = bytes(args)[: signature.end]  # only what the parameters take: all the daemon reads
        self._send(commands.Launch.pack(num_blocks, stream, function, args), stream, site)

    @records_errors
    def launch_kernel_devargs(
        self,
        function: int,
        num_blocks: int,
        args_ptr: int,
        args_size: int,
        stream: int,
        site: str | None = None,
    ) -> None:
        """aclrtLaunchKernel (async): the parameter buffer lies in device memory."""
        signature = self.signature(function)
        check_num_blocks(num_blocks)
        if args_size < signature.end:
            raise invalid(
                f"argument buffer of {args_size} bytes is shorter than "
                f"the {signature.end} bytes needed"
            )
        self._allocations.device_range(args_ptr, args_size)
        stream = self._contexts.stream(stream)
        record = commands.LaunchDeviceArgs.pack(num_blocks, stream, function, args_ptr, args_size)
        self._send(record, stream, site)

    @records_errors
    def launch_kernel_with_config(
        self,
        function: int,
        num_blocks: int,
        stream: int,
        cfg,
        args_handle: int,
        reserve: int,
        site: str | None = None,
    ) -> None:
        """aclrtLaunchKernelWithConfig (async): the arguments of a finalized kernel-args
        handle (`args`), with the launch attributes of `cfg`."""
        record, stream = self.args.launch(function, num_blocks, stream, cfg, args_handle, reserve)
        self._send(record, stream, site)

    @records_errors
    def set_op_execute_timeout(self, milliseconds: int, site: str | None = None) -> None:
        """aclrtSetOpExecuteTimeOutWithMs: 0 restores the daemon's default. Blocks."""
        wire_int(milliseconds, "milliseconds")
        self._calls.request(pb.SetOpExecuteTimeoutRequest(milliseconds=milliseconds), site)

    # ---- built-in tasks ------------------------------------------------------------------------
    @records_errors
    def reduce_async(
        self,
        dst: int,
        src: int,
        count: int,
        kind: int,
        data_type: int,
        stream: int,
        reserve: int,
        site: str | None = None,
    ) -> None:
        """aclrtReduceAsync (async): dst = dst (op) src element-wise over `count` bytes."""
        if reserve:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "aclrtReduceAsync reserve must be null")
        builtin_tasks.check_reduce(count, kind, data_type, dst, src)
        stream = self._contexts.stream(stream)
        self._allocations.device_range(dst, count)
        self._allocations.device_range(src, count)
        record = commands.Reduce.pack(stream, dst, src, count, kind, data_type)
        self._calls.command(record, stream, site)

    @records_errors
    def random_num_async(
        self, task_info: dict, stream: int, reserve: int, site: str | None = None
    ) -> None:
        """aclrtRandomNumAsync (async): `task_info` is an aclrtRandomNumTaskInfo as a dict."""
        data_type = _int(task_info, "data_type")
        para = task_info.get("random_num_func_para_info") or {}
        func_type = _int(para, "func_type")
        result = _int(task_info, "random_result_addr")
        counter = _int(task_info, "random_counter_addr")
        seed = _parameter(task_info.get("random_seed"))
        num = _parameter(task_info.get("random_num"))
        parameters = _union(para.get("param_info") or {})
        if data_type not in builtin_tasks.RANDOM_TYPES:  # the ACL layer's check comes first
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"aclrtRandomNumAsync dataType {data_type}: the data type is not supported",
            )
        if reserve:
            raise invalid("aclrtRandomNumAsync reserve must be null")
        dtype = builtin_tasks.check_random(
            data_type, func_type, result, counter, parameters, seed, num
        )
        stream = self._contexts.stream(stream)
        size = builtin_tasks.element_size(dtype)
        check = self._allocations.device_range
        check(counter, COUNTER_BYTES)
        check(result, 1)
        if not num.is_addr:
            amount = int.from_bytes(num.value[: num.size], "little")
            if func_type == codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_DROPOUT_BITMASK:
                check(result, max(1, -(-amount // 8)))
            else:
                check(result, max(1, amount * size))
        for parameter, nbytes in (*((p, size) for p in parameters), (seed, 8), (num, 8)):
            if parameter.is_addr:
                check(parameter.address, nbytes)
        record = commands.RandomNum.pack(
            stream, data_type, func_type, result, counter, parameters, seed, num
        )
        self._calls.command(record, stream, site)


_HOST_ARGS: dict[int, type[ctypes.Array]] = {}  # argument-struct size -> ctypes array type


def _host_args_type(
    cfg, place_holders, place_holder_num: int, host_args_ptr: int, args_size: int
) -> type[ctypes.Array]:
    """The slow path of launch_kernel_with_host_args: what it refuses, and a ctypes array type
    for a struct size not seen yet (string_at would cost twice as much on every launch)."""
    if cfg:
        raise NotSupportedError("aclrtLaunchKernelWithHostArgs launch attributes (cfg)")
    if place_holders or place_holder_num:
        raise NotSupportedError("aclrtLaunchKernelWithHostArgs place holders")
    if host_args_ptr >= DEVICE_BASE:
        raise invalid(
            f"host_args_ptr {host_args_ptr:#x} is a device address: launch_kernel takes "
            "arguments in device memory, launch_kernel_with_host_args in host memory"
        )
    if args_size < 0:
        raise invalid(f"args_size {args_size} is negative")
    struct_type = ctypes.c_char * args_size
    if len(_HOST_ARGS) < 256:
        _HOST_ARGS[args_size] = struct_type
    return struct_type


def _int(fields: dict, name: str) -> int:
    value = fields.get(name, 0) if isinstance(fields, dict) else None
    if not isinstance(value, int):
        raise TypeError(f"acl.rt.random_num_async: {name} must be an int")
    return value


def _parameter(fields: Any) -> RandomParameter:
    """An aclrtRandomParaInfo dict: is_addr, value_or_addr (bytes of at most 8, a list of
    byte values, or an int: its 8 little-endian bytes), size. Missing fields are zero."""
    fields = fields or {}
    if not isinstance(fields, dict):
        raise TypeError("acl.rt.random_num_async: an aclrtRandomParaInfo must be a dict")
    raw = fields.get("value_or_addr", 0)
    if isinstance(raw, int):
        value = (raw % (1 << 64)).to_bytes(WORD_BYTES, "little")
    elif isinstance(raw, (bytes, bytearray, list, tuple)) and len(raw) <= WORD_BYTES:
        value = bytes(raw).ljust(WORD_BYTES, b"\0")
    else:
        raise TypeError("acl.rt.random_num_async: value_or_addr must be an int or <= 8 bytes")
    return RandomParameter(_int(fields, "is_addr"), value, _int(fields, "size"))


def _union(param_info: dict) -> tuple[RandomParameter, ...]:
    """paramInfo's two parameters: its one member's, in order. As in C's union, the member
    need not be the generator's own: its first two parameters are read the same way."""
    if not isinstance(param_info, dict):
        raise TypeError("acl.rt.random_num_async: param_info must be a dict")
    members = [name for name in _UNION if name in param_info]
    if len(members) > 1:
        raise TypeError("acl.rt.random_num_async: param_info holds one member of its union")
    member = param_info[members[0]] if members else {}
    if not isinstance(member, dict):
        raise TypeError("acl.rt.random_num_async: a param_info member must be a dict")
    names = _UNION[members[0]] if members else ()
    values = [member.get(name) for name in names] + [None, None]
    return tuple(_parameter(v) for v in values[:2])
