"""The kernel-arguments builder (aclrtKernelArgs*) and aclrtLaunchKernelWithConfig.

A handle's buffer is host memory laid out as the kernel's argument struct
(simnpu.proto.kernel_abi): the n-th appended parameter lands at the n-th field's offset and
must have its size. A place holder is a `ptr` parameter whose data the program writes into
the handle's buffer (aclrtKernelArgsGetPlaceHolderBuffer, after the struct, 8-byte
aligned); the launch carries the data and the daemon puts it in device memory of the
launch's own, which the parameter then points to. As in the CANN runtime, aclrtKernelArgsInit
reuses one handle per thread (a second init resets it), a handle holds at most 128
parameters and 64 KiB, nothing may be appended once a place-holder buffer was taken or the
handle was finalized (207000), and only a finalized handle launches.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simnpu.proto import codes, commands
from simnpu.proto.errors import NotSupportedError, NpuError, check_num_blocks, invalid

if TYPE_CHECKING:
    from simnpu.proto.kernel_abi import KernelSignature

MAX_PARAMS = 128  # MAX_PARAM_CNT
MAX_ARGS_BYTES = 64 * 1024  # MAX_ARGS_BUFF_SIZE
_ALIGN = 8  # the runtime's alignment of a place holder's data
_PARAM_SHIFT = 8  # a parameter handle is (args handle << 8) | (index + 1)
_TIMEOUT_FOREVER = (1 << 64) - 1  # LaunchWithConfig: an explicit 0 (wait forever)
_SIZES = {"i8": 1, "u8": 1, "i16": 2, "u16": 2, "f16": 2, "i32": 4, "u32": 4, "f32": 4}


@dataclass
class Param:
    offset: int  # in the argument struct
    size: int
    place_holder: bool
    data_offset: int = 0  # a place holder's buffer in the handle's buffer (0: none yet)
    data_size: int = 0


@dataclass
class ArgsHandle:
    """One handle's state: the function it is for, its buffer and its parameters."""

    function: int
    address: int  # of `buffer`, or of the user's memory (aclrtKernelArgsInitByUserMem)
    capacity: int
    buffer: Any = None  # the ctypes array when the runtime owns the memory
    params: list[Param] = field(default_factory=list)
    end: int = 0  # bytes of the buffer in use
    got_buffer: bool = False
    finalized: bool = False
    updating: bool = False


class KernelArgs:
    """The builder's handles of one session (rt.kernels.args), given how to find a
    function's signature and the stream a call means."""

    def __init__(self, signature: Callable[[int], KernelSignature], stream: Callable[[int], int]):
        self._signature = signature
        self._stream = stream
        self._handles: dict[int, ArgsHandle] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._next = 1

    # ---- handles -------------------------------------------------------------------------------
    def _get(self, handle: int) -> ArgsHandle:
        state = self._handles.get(handle)
        if state is None:
            raise NpuError(
                codes.ACL_ERROR_RT_INVALID_HANDLE, f"kernel-args handle {handle:#x} is not valid"
            )
        return state

    def _param(self, handle: int, param: int) -> tuple[ArgsHandle, Param]:
        state = self._get(handle)
        index = (param & ((1 << _PARAM_SHIFT) - 1)) - 1
        if param >> _PARAM_SHIFT != handle or not 0 <= index < len(state.params):
            raise NpuError(
                codes.ACL_ERROR_RT_INVALID_HANDLE,
                f"parameter handle {param:#x} is not one of kernel-args handle {handle:#x}",
            )
        return state, state.params[index]

    def _new(self) -> int:
        with self._lock:
            handle = self._next
            self._next += 1
        return handle

    def init(self, function: int) -> int:
        """aclrtKernelArgsInit: this thread's handle, reset for `function`."""
        self._signature(function)
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = self._new()
            buffer = (ctypes.c_char * MAX_ARGS_BYTES)()
        else:
            buffer = self._handles[handle].buffer
        ctypes.memset(buffer, 0, MAX_ARGS_BYTES)
        self._handles[handle] = ArgsHandle(
            function, ctypes.addressof(buffer), MAX_ARGS_BYTES, buffer
        )
        return handle

    def init_by_user_mem(self, function: int, handle: int, memory: int, size: int) -> None:
        """aclrtKernelArgsInitByUserMem: `handle` (memory of get_handle_mem_size bytes the
        program owns) builds in the program's host memory [memory, +size)."""
        self._signature(function)
        self._handles[handle] = ArgsHandle(function, memory, size)

    def mem_size(self, function: int, user_args_size: int) -> int:
        """aclrtKernelArgsGetMemSize: bytes of memory init_by_user_mem needs for
        `user_args_size` bytes of parameters (their struct, padded, and 8 bytes a parameter
        of alignment, as the runtime reserves)."""
        signature = self._signature(function)
        return max(user_args_size, signature.size) + _ALIGN * len(signature.types)

    def handle_mem_size(self, function: int) -> int:
        """aclrtKernelArgsGetHandleMemSize: the bytes of a handle's own memory."""
        self._signature(function)
        return 64 + 16 * MAX_PARAMS

    # ---- building ------------------------------------------------------------------------------
    def _appendable(self, state: ArgsHandle) -> None:
        if state.finalized:
            raise NotSupportedError("appending to a finalized kernel-args handle")
        if state.got_buffer:
            raise NotSupportedError("appending after aclrtKernelArgsGetPlaceHolderBuffer")
        types = self._signature(state.function).types
        if len(state.params) >= min(len(types), MAX_PARAMS):
            raise invalid(
                f"the kernel takes {len(types)} parameter(s) "
                f"({','.join(types) or 'none'}): all are appended"
            )

    def _add(self, handle: int, state: ArgsHandle, size: int, place_holder: bool) -> int:
        signature = self._signature(state.function)
        index = len(state.params)
        kind = signature.types[index]
        need = _SIZES.get(kind, 8)
        if place_holder and kind != "ptr":
            raise invalid(f"parameter {index} is {kind}: a place holder is a ptr parameter")
        if size != need:
            raise invalid(f"parameter {index} is {kind} ({need} bytes), not {size} bytes")
        offset = signature.offsets[index]
        if offset + size > state.capacity:
            raise invalid(f"the parameters need more than the handle's {state.capacity} bytes")
        state.params.append(Param(offset, size, place_holder))
        state.end = max(state.end, offset + size)
        return (handle << _PARAM_SHIFT) | (index + 1)

    def append(self, handle: int, param_ptr: int, size: int) -> int:
        """aclrtKernelArgsAppend: copy the `size` bytes at host address `param_ptr` in as the
        next parameter; its handle."""
        state = self._get(handle)
        self._appendable(state)
        param = self._add(handle, state, size, False)
        ctypes.memmove(state.address + state.params[-1].offset, param_ptr, size)
        return param

    def append_place_holder(self, handle: int) -> int:
        """aclrtKernelArgsAppendPlaceHolder: the next parameter (a ptr) is a place holder."""
        state = self._get(handle)
        self._appendable(state)
        return self._add(handle, state, 8, True)

    def place_holder_buffer(self, handle: int, param: int, size: int) -> int:
        """aclrtKernelArgsGetPlaceHolderBuffer: host memory of `size` bytes to fill with the
        place holder's data (in the handle's buffer)."""
        state, entry = self._param(handle, param)
        if not entry.place_holder:
            raise invalid("the parameter is not a place holder")
        if state.finalized:
            raise NotSupportedError("taking a place-holder buffer of a finalized handle")
        signature = self._signature(state.function)
        start = -(-max(state.end, signature.size) // _ALIGN) * _ALIGN
        if start + size > state.capacity:
            raise invalid(
                f"a place-holder buffer of {size} bytes does not fit the handle's "
                f"{state.capacity} bytes ({start} in use)"
            )
        state.got_buffer = True
        entry.data_offset, entry.data_size = start, size
        state.end = start + size
        return state.address + start

    def para_update(self, handle: int, param: int, param_ptr: int, size: int) -> None:
        """aclrtKernelArgsParaUpdate: new bytes for an appended (not place-holder) parameter;
        finalize again before the next launch."""
        state, entry = self._param(handle, param)
        if entry.place_holder:
            raise invalid("a place holder's data is updated through its buffer")
        if size != entry.size:
            raise invalid(f"the parameter has {entry.size} bytes, not {size}")
        ctypes.memmove(state.address + entry.offset, param_ptr, size)
        state.updating = True

    def finalize(self, handle: int) -> None:
        """aclrtKernelArgsFinalize: the handle is complete and may launch."""
        state = self._get(handle)
        types = self._signature(state.function).types
        if len(state.params) != len(types):
            raise invalid(
                f"the kernel takes {len(types)} parameter(s), {len(state.params)} appended"
            )
        state.finalized = True
        state.updating = False

    # ---- launching -----------------------------------------------------------------------------
    def launch(
        self, function: int, num_blocks: int, stream: int, cfg: Any, handle: int, reserve: int
    ) -> tuple[bytes, int]:
        """aclrtLaunchKernelWithConfig's packed record and its stream handle."""
        if reserve:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "reserve must be null")
        state = self._get(handle)
        if not state.finalized or state.updating:
            raise invalid("the kernel-args handle is not finalized, or updated since")
        if state.function != function:
            raise invalid("the kernel-args handle was built for another function")
        signature = self._signature(function)
        check_num_blocks(num_blocks)
        timeout_us = launch_timeout_us(cfg)
        args = ctypes.string_at(state.address, signature.end)
        place_holders = []
        for index, entry in enumerate(state.params):
            if entry.place_holder:
                if not entry.data_size:
                    raise invalid(f"place holder {index} has no buffer")
                data = ctypes.string_at(state.address + entry.data_offset, entry.data_size)
                place_holders.append((entry.offset, data))
        stream = self._stream(stream)
        return commands.LaunchWithConfig.pack(
            num_blocks, stream, function, timeout_us, args, place_holders
        ), stream


# ---- launch attributes (aclrtLaunchKernelAttr) ---------------------------------------------------
_ATTR_RANGES = {  # attribute id -> (field of aclrtLaunchKernelAttrValue, highest value accepted)
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE: ("schem_mode", 1),
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_DYN_UBUF_SIZE: ("dyn_ubuf_size", 0xFFFFFFFF),
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_ENGINE_TYPE: ("engine_type", codes.ACL_RT_ENGINE_TYPE_AIV),
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_BLOCKDIM_OFFSET: ("block_dim_offset", 0xFFFFFFFF),
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_BLOCK_TASK_PREFETCH: ("is_block_task_prefetch", 1),
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_DATA_DUMP: ("is_data_dump", 1),
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT: ("timeout", 0xFFFF),
    codes.ACL_RT_LAUNCH_KERNEL_ATTR_ENABLE_PROFILING: ("enable_profiling", 1),
}


def launch_timeout_us(cfg: Any) -> int:
    """Check a launch configuration -- None, or a dict {"attrs": [{"id": ..., "value":
    {...}}], "num_attrs": n} (aclrtLaunchKernelCfg) -- and give its timeout for the wire:
    0 none given, _TIMEOUT_FOREVER for an explicit 0, else microseconds. 107000 for a value
    out of its range or TIMEOUT with TIMEOUT_US (as the runtime refuses them)."""
    if cfg is None or cfg == 0:
        return 0
    if not isinstance(cfg, dict) or not isinstance(cfg.get("attrs"), list):
        raise invalid('cfg must be None or {"attrs": [...], "num_attrs": n}')
    attrs = cfg["attrs"]
    count = cfg.get("num_attrs", len(attrs))
    if not isinstance(count, int) or not 0 <= count <= len(attrs):
        raise invalid(f"num_attrs {count!r} does not match the {len(attrs)} attrs given")
    timeout_us = None
    seen = set()
    for attr in attrs[:count]:
        if not isinstance(attr, dict) or not isinstance(attr.get("value"), dict):
            raise invalid('a launch attribute is {"id": ..., "value": {...}}')
        ident, value = attr.get("id"), attr["value"]
        seen.add(ident)
        if ident == codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US:
            us = value.get("timeout_us", {})
            low, high = us.get("timeout_low", 0), us.get("timeout_high", 0)
            if not all(isinstance(v, int) and 0 <= v <= 0xFFFFFFFF for v in (low, high)):
                raise invalid("timeout_us: timeout_low and timeout_high are uint32")
            timeout_us = (high << 32) | low
            continue
        entry = _ATTR_RANGES.get(ident) if isinstance(ident, int) else None
        if entry is None:
            continue  # the runtime ignores attribute ids it does not know
        name, highest = entry
        number = value.get(name, 0)
        if not isinstance(number, int) or not 0 <= number <= highest:
            raise invalid(f"launch attribute {ident} ({name}) {number!r}: 0 to {highest}")
        if ident == codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT:
            timeout_us = number * 1_000_000
    if {
        codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT,
        codes.ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT_US,
    } <= seen:
        raise invalid("ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT and _TIMEOUT_US cannot both be given")
    if timeout_us is None:
        return 0
    return timeout_us or _TIMEOUT_FOREVER
