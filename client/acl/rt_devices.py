"""acl.rt device queries, resource limits, memory helpers and host-function threads.

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last. The
device is simulated: its SoC name and figures are simnpu's own (docs/acl.md).
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

from . import identity as _identity

__all__ = [
    "check_arch_compatibility",
    "check_mem_type",
    "free_host_with_dev_sync",
    "free_with_dev_sync",
    "get_device_capability",
    "get_device_info",
    "get_device_res_limit",
    "get_device_utilization_rate",
    "get_res_in_current_thread",
    "get_soc_name",
    "memset_d32",
    "memset_d32_async",
    "process_host_func",
    "query_device_status",
    "reset_device_res_limit",
    "set_device_res_limit",
    "subscribe_host_func",
    "unsubscribe_host_func",
]


# ---- device queries --------------------------------------------------------------------------
def get_soc_name():
    """aclrtGetSocName: simnpu's own SoC name (the device is simulated; no Ascend chip)."""
    return _identity.SOC_NAME


@api("s", (0,), needs_session=False)
def check_arch_compatibility(rt, soc_version):
    """aclrtCheckArchCompatibility: `can_compatible, ret` -- 1 only for simnpu's own SoC name
    (code built for a real chip cannot run on the simulated NPU)."""
    if not soc_version:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "socVersion is empty")
    return int(soc_version == _identity.SOC_NAME)


@api("Ii", (0,))
def get_device_info(rt, device_id, attr, *, site):
    """aclrtGetDeviceInfo: `value, ret` (AI cores, memory size, ...); 207000 for attributes
    the simulated device has no figure for. Blocks."""
    return rt.devices.get_device_info(device_id, attr, site=site)


@api("ii", (0,))
def get_device_capability(rt, device_id, dev_feature_type):
    """aclrtGetDeviceCapability: `value, ret` -- 0: the feature is not available."""
    return rt.devices.get_device_capability(device_id, dev_feature_type)


@api("i", (codes.ACL_RT_DEVICE_STATUS_END,))
def query_device_status(rt, device_id, *, site):
    """aclrtQueryDeviceStatus: `status, ret` (ACL_RT_DEVICE_STATUS_NORMAL). Blocks."""
    return rt.devices.query_device_status(device_id, site=site)


@api("i", ({},))
def get_device_utilization_rate(rt, device_id, *, site):
    """aclrtGetDeviceUtilizationRate: `{"cube_utilization", "vector_utilization",
    "aicpu_utilization", "memory_utilization"}, ret` in percent (-1: not measured). Blocks."""
    return rt.devices.get_device_utilization_rate(device_id, site=site)


# ---- resource limits ---------------------------------------------------------------------------
@api("iI", (0,))
def get_device_res_limit(rt, device_id, type, *, site):  # noqa: A002 - pyACL's parameter name
    """aclrtGetDeviceResLimit: `value, ret`, cores of the type this process may use. Blocks."""
    return rt.devices.get_device_res_limit(device_id, type, site=site)


@api("iII")
def set_device_res_limit(rt, device_id, type, value, *, site):  # noqa: A002 - pyACL's parameter name
    """aclrtSetDeviceResLimit: this process's kernels run on at most `value` AI cores of the
    device (enforced by the daemon's scheduler). Blocks."""
    rt.devices.set_device_res_limit(device_id, type, value, site=site)


@api("i")
def reset_device_res_limit(rt, device_id, *, site):
    """aclrtResetDeviceResLimit: every AI core again. Blocks."""
    rt.devices.reset_device_res_limit(device_id, site=site)


@api("I", (0,))
def get_res_in_current_thread(rt, type, *, site):  # noqa: A002 - pyACL's parameter name
    """aclrtGetResInCurrentThread: `value, ret`, the limit in force for this thread: the
    limits of the stream it uses (use_stream_res_in_current_thread), else its process's on
    its current device, else every AI core. Blocks."""
    return rt.devices.get_res_in_current_thread(type, site=site)


# ---- memory helpers ----------------------------------------------------------------------------
@api("kkIk")
def memset_d32(rt, dev_ptr, mem_size, value, count, *, site):
    """aclrtMemsetD32: `count` 32-bit words of `value` (host or device memory). Blocks."""
    rt.memory.memset_d32(dev_ptr, mem_size, value, count, None, site=site)


@api("kkIkk")
def memset_d32_async(rt, dev_ptr, mem_size, value, count, stream, *, site):
    """aclrtMemsetD32Async: stream-ordered for device memory; host memory is filled at once."""
    rt.memory.memset_d32(dev_ptr, mem_size, value, count, stream, site=site)


@api("k")
def free_with_dev_sync(rt, dev_ptr, *, site):
    """aclrtFreeWithDevSync: waits for the current device's work, then frees. Blocks."""
    rt.memory.free_with_dev_sync(dev_ptr, site=site)


@api("k")
def free_host_with_dev_sync(rt, host_ptr, *, site):
    """aclrtFreeHostWithDevSync: waits for the current device's work, then frees. Blocks."""
    rt.host.free_host_with_dev_sync(host_ptr, site=site)


@api("OII", (0,))
def check_mem_type(rt, addr_list, mem_type, reserve):
    """aclrtCheckMemType: `check_result, ret` -- 1 if every address of the list is device
    memory of this process and `mem_type` includes ACL_RT_MEM_TYPE_DEV or _DVPP, else 0."""
    if not isinstance(addr_list, (list, tuple)) or not all(
        isinstance(address, int) for address in addr_list
    ):
        raise TypeError("acl.rt.check_mem_type: addr_list must be a list of ints")
    return rt.memory.check_mem_type(list(addr_list), mem_type, reserve)


# ---- host-function threads ---------------------------------------------------------------------
@api("Kk")
def subscribe_host_func(rt, host_func_thread_id, exe_stream):
    """aclrtSubscribeHostFunc: that thread runs the stream's launch_host_func functions in
    process_host_func; 100033 if the stream already has one."""
    rt.callbacks.subscribe_host_func(host_func_thread_id, exe_stream)


@api("i")
def process_host_func(rt, timeout):
    """aclrtProcessHostFunc: run one host function of this thread's streams (ms > 0, or -1
    forever); 507012 when none arrives in time, 107012 while no stream is subscribed to this
    thread. Blocks."""
    if timeout < -1 or timeout == 0:
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM,
            f"timeout {timeout}: -1 waits forever, a positive value waits that many milliseconds",
        )
    rt.callbacks.process_host_func(timeout)


@api("Kk")
def unsubscribe_host_func(rt, host_func_thread_id, exe_stream):
    """aclrtUnSubscribeHostFunc: 100034 if not subscribed."""
    rt.callbacks.unsubscribe_host_func(host_func_thread_id, exe_stream)


__getattr__, __dir__ = _on_demand(globals())
