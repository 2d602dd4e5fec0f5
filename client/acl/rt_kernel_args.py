"""acl.rt's kernel-arguments builder (aclrtKernelArgs*) and aclrtLaunchKernelWithConfig.

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last. A
kernel-args handle and a parameter handle are ints; place-holder buffers are host
addresses to fill (ctypes, numpy). The builder runs in this process (client/runtime/kernel_args.py);
semantics in docs/acl.md, "Kernel arguments built with the runtime".
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand
from simnpu.proto import codes
from simnpu.proto.errors import NpuError as _NpuError

__all__ = [
    "kernel_args_append",
    "kernel_args_append_place_holder",
    "kernel_args_finalize",
    "kernel_args_get_handle_mem_size",
    "kernel_args_get_mem_size",
    "kernel_args_get_place_holder_buffer",
    "kernel_args_init",
    "kernel_args_init_by_user_mem",
    "kernel_args_para_update",
    "launch_kernel_with_config",
]


def _positive(value: int, name: str) -> None:
    if value <= 0:
        raise _NpuError(codes.ACL_ERROR_INVALID_PARAM, f"{name} must be positive")


@api("k", (0,), nonnull=("func",))
def kernel_args_init(rt, func):
    """aclrtKernelArgsInit: `args_handle, ret` -- this thread's handle, reset for `func` (as
    in the CANN runtime, a second init on the same thread reuses it)."""
    return rt.kernels.args.init(func)


@api("kkkk", nonnull=("func", "args_handle", "user_host_mem"))
def kernel_args_init_by_user_mem(rt, func, args_handle, user_host_mem, actual_args_size):
    """aclrtKernelArgsInitByUserMem: build in host memory the program owns --
    `args_handle` (get_handle_mem_size bytes) and `user_host_mem` (get_mem_size bytes)."""
    _positive(actual_args_size, "actual_args_size")
    rt.kernels.args.init_by_user_mem(func, args_handle, user_host_mem, actual_args_size)


@api("kk", (0,), nonnull=("func",))
def kernel_args_get_mem_size(rt, func, user_args_size):
    """aclrtKernelArgsGetMemSize: `actual_args_size, ret` for init_by_user_mem."""
    return rt.kernels.args.mem_size(func, user_args_size)


@api("k", (0,), nonnull=("func",))
def kernel_args_get_handle_mem_size(rt, func):
    """aclrtKernelArgsGetHandleMemSize: `mem_size, ret` of a handle for init_by_user_mem."""
    return rt.kernels.args.handle_mem_size(func)


@api("kkk", (0,), nonnull=("args_handle", "param_ptr"))
def kernel_args_append(rt, args_handle, param_ptr, param_size):
    """aclrtKernelArgsAppend: `param_handle, ret`; the `param_size` bytes at host address
    `param_ptr` become the next parameter (its declared type's size)."""
    _positive(param_size, "param_size")
    return rt.kernels.args.append(args_handle, param_ptr, param_size)


@api("k", (0,), nonnull=("args_handle",))
def kernel_args_append_place_holder(rt, args_handle):
    """aclrtKernelArgsAppendPlaceHolder: `param_handle, ret`; the next parameter (a ptr)
    will point at device memory holding its buffer's data at launch."""
    return rt.kernels.args.append_place_holder(args_handle)


@api("kkk", (0,), nonnull=("args_handle", "param_handle"))
def kernel_args_get_place_holder_buffer(rt, args_handle, param_handle, data_size):
    """aclrtKernelArgsGetPlaceHolderBuffer: `buffer_ptr, ret`, host memory of `data_size`
    bytes to fill with the place holder's data."""
    _positive(data_size, "data_size")
    return rt.kernels.args.place_holder_buffer(args_handle, param_handle, data_size)


@api("kkkk", nonnull=("args_handle", "param_handle", "param_ptr"))
def kernel_args_para_update(rt, args_handle, param_handle, param_ptr, param_size):
    """aclrtKernelArgsParaUpdate: new bytes for an appended parameter (finalize again)."""
    _positive(param_size, "param_size")
    rt.kernels.args.para_update(args_handle, param_handle, param_ptr, param_size)


@api("k", nonnull=("args_handle",))
def kernel_args_finalize(rt, args_handle):
    """aclrtKernelArgsFinalize: every parameter is appended; the handle may launch."""
    rt.kernels.args.finalize(args_handle)


@api("kIkOkk", nonnull=("func", "args_handle"))
def launch_kernel_with_config(rt, func, num_blocks, stream, cfg, args_handle, reserve, *, site):
    """aclrtLaunchKernelWithConfig (async): launch `func` with a finalized handle's
    arguments; `cfg` is None or {"attrs": [{"id": ..., "value": {...}}], "num_attrs": n}
    (aclrtLaunchKernelCfg, fields in snake case); `reserve` must be 0."""
    _positive(num_blocks, "num_blocks")
    rt.kernels.launch_kernel_with_config(
        func, num_blocks, stream, cfg, args_handle, reserve, site=site
    )


__getattr__, __dir__ = _on_demand(globals())
