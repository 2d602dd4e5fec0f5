"""acl.rt calls of the CANN runtime headers that simnpu does not simulate: binaries made
by aclrtCreateBinary, cacheable memory and allocation attributes, pitched, conditional and
described copies, stream and event attributes, timeouts, device limits and id mapping,
system parameters, notify ids, user allocators, host memory mapping, virtual memory links,
device symbols, mbufs, groups, snapshots, fault repair and other launch forms.

client/acl/rt.py turns every entry into a call that returns ACL_ERROR_RT_FEATURE_NOT_SUPPORT
(207000) in pyACL's shape and lists it in acl.rt.UNSUPPORTED; docs/acl.md's table of every
runtime function (docs/cann_functions.py) shows the reasons.
"""

from __future__ import annotations

from simnpu.proto import codes

_NOTIFY = "notify ids and batch resets are not simulated"
_ALLOC = "user allocators for streams are not simulated"
_CAPS = "the simulated device has no such attribute or capability to report"
_BINARY = (
    "aclrtCreateBinary objects are not simulated: use binary_load_from_file or "
    "binary_load_from_data"
)
_BASIC_CALLS: dict[str, tuple[str, tuple | None, str]] = {
    "get_function_addr": ("aclrtGetFunctionAddr", (0, 0), "kernels have no device code address"),
    "get_function_name": ("aclrtGetFunctionName", ("",), "function names are not kept"),
    "register_cpu_func": ("aclrtRegisterCpuFunc", (0,), "AI CPU kernels are not simulated"),
    "binary_load": ("aclrtBinaryLoad", (0,), _BINARY),
    "destroy_binary": ("aclrtDestroyBinary", None, "aclrtCreateBinary objects are not simulated"),
    "set_ts_device": ("aclrtSetTsDevice", None, "task schedulers cannot be chosen"),
    "malloc_cached": ("aclrtMallocCached", (0,), "cacheable device memory is not simulated"),
    "mem_flush": ("aclrtMemFlush", None, "cacheable device memory is not simulated"),
    "mem_invalidate": ("aclrtMemInvalidate", None, "cacheable device memory is not simulated"),
    "malloc_with_cfg": ("aclrtMallocWithCfg", (0,), "allocation attributes are not simulated"),
    "malloc_for_task_scheduler": (
        "aclrtMallocForTaskScheduler",
        (0,),
        "allocation attributes are not simulated",
    ),
    "malloc_host_with_cfg": (
        "aclrtMallocHostWithCfg",
        (0,),
        "allocation attributes are not simulated",
    ),
    "memcpy2d": ("aclrtMemcpy2d", None, "pitched copies are not simulated"),
    "memcpy2d_async": ("aclrtMemcpy2dAsync", None, "pitched copies are not simulated"),
    "memcpy_async_with_condition": (
        "aclrtMemcpyAsyncWithCondition",
        None,
        "conditional copies are not simulated",
    ),
    "get_memcpy_desc_size": ("aclrtGetMemcpyDescSize", (0,), "copy descriptors are not simulated"),
    "set_memcpy_desc": ("aclrtSetMemcpyDesc", (0,), "copy descriptors are not simulated"),
    "memcpy_async_with_desc": (
        "aclrtMemcpyAsyncWithDesc",
        None,
        "copy descriptors are not simulated",
    ),
    "cmo_async": ("aclrtCmoAsync", None, "cache maintenance operations are not simulated"),
    "device_task_abort": (
        "aclrtDeviceTaskAbort",
        None,
        "aborting every task of a device is not simulated (stream_abort ends one stream's)",
    ),
    "get_stream_available_num": (
        "aclrtGetStreamAvailableNum",
        (0,),
        "the stream limit is device-wide and the daemon does not report what is left",
    ),
    "set_stream_attribute": (
        "aclrtSetStreamAttribute",
        None,
        "stream attributes are not simulated (use set_stream_failure_mode)",
    ),
    "get_stream_attribute": (
        "aclrtGetStreamAttribute",
        ({},),
        "stream attributes are not simulated",
    ),
    "query_event_wait_status": (
        "aclrtQueryEventWaitStatus",
        (codes.ACL_EVENT_WAIT_STATUS_RESERVED,),
        "the daemon does not report whether an event's waiters have passed",
    ),
    "get_event_id": ("aclrtGetEventId", (0,), "events have no hardware id"),
    "get_event_avail_num": (
        "aclrtGetEventAvailNum",
        (0,),
        "the event limit is device-wide and the daemon does not report what is left",
    ),
    "set_op_wait_timeout": (
        "aclrtSetOpWaitTimeout",
        None,
        "wait tasks have no device-side timeout",
    ),
    "set_op_execute_timeout_v2": (
        "aclrtSetOpExecuteTimeOutV2",
        (0,),
        "use set_op_execute_time_out (seconds)",
    ),
    "get_op_timeout_interval": (
        "aclrtGetOpTimeOutInterval",
        (0,),
        "the timeout interval is not reported",
    ),
    "get_op_execute_timeout": (
        "aclrtGetOpExecuteTimeout",
        (0,),
        "the operator timeout is not reported",
    ),
    "device_get_uuid": ("aclrtDeviceGetUuid", ({},), _CAPS),
    "get_devices_topo": ("aclrtGetDevicesTopo", (0,), _CAPS),
    "device_set_limit": ("aclrtDeviceSetLimit", None, "device limits are not simulated"),
    "device_get_limit": ("aclrtDeviceGetLimit", (0,), "device limits are not simulated"),
    "ctx_set_sys_param_opt": (
        "aclrtCtxSetSysParamOpt",
        None,
        "system parameter options are not simulated",
    ),
    "ctx_get_sys_param_opt": (
        "aclrtCtxGetSysParamOpt",
        (0,),
        "system parameter options are not simulated",
    ),
    "set_sys_param_opt": (
        "aclrtSetSysParamOpt",
        None,
        "system parameter options are not simulated",
    ),
    "get_sys_param_opt": (
        "aclrtGetSysParamOpt",
        (0,),
        "system parameter options are not simulated",
    ),
    "get_primary_ctx_state": (
        "aclrtGetPrimaryCtxState",
        (0, 0),
        "primary context state is not reported",
    ),
    "get_logic_dev_id_by_user_dev_id": (
        "aclrtGetLogicDevIdByUserDevId",
        (0,),
        "device id mapping is not simulated",
    ),
    "get_user_dev_id_by_logic_dev_id": (
        "aclrtGetUserDevIdByLogicDevId",
        (0,),
        "device id mapping is not simulated",
    ),
    "get_logic_dev_id_by_phy_dev_id": (
        "aclrtGetLogicDevIdByPhyDevId",
        (0,),
        "device id mapping is not simulated",
    ),
    "get_phy_dev_id_by_logic_dev_id": (
        "aclrtGetPhyDevIdByLogicDevId",
        (0,),
        "device id mapping is not simulated",
    ),
    "get_notify_id": ("aclrtGetNotifyId", (0,), _NOTIFY),
    "notify_batch_reset": ("aclrtNotifyBatchReset", None, _NOTIFY),
    "allocator_destroy_desc": ("aclrtAllocatorDestroyDesc", None, _ALLOC),
    "allocator_set_obj_to_desc": ("aclrtAllocatorSetObjToDesc", None, _ALLOC),
    "allocator_set_alloc_func_to_desc": ("aclrtAllocatorSetAllocFuncToDesc", None, _ALLOC),
    "allocator_set_free_func_to_desc": ("aclrtAllocatorSetFreeFuncToDesc", None, _ALLOC),
    "allocator_set_alloc_advise_func_to_desc": (
        "aclrtAllocatorSetAllocAdviseFuncToDesc",
        None,
        _ALLOC,
    ),
    "allocator_set_get_addr_from_block_func_to_desc": (
        "aclrtAllocatorSetGetAddrFromBlockFuncToDesc",
        None,
        _ALLOC,
    ),
    "allocator_register": ("aclrtAllocatorRegister", None, _ALLOC),
    "allocator_unregister": ("aclrtAllocatorUnregister", None, _ALLOC),
}
_BASIC_VALUES: dict[str, tuple[str, object, str]] = {
    "create_binary": ("aclrtCreateBinary", 0, _BINARY),
    "allocator_create_desc": ("aclrtAllocatorCreateDesc", 0, _ALLOC),
}

# name: (C call, values returned before ret (None: ret only), why)
_VMM = "mapping without access, over chosen links or between devices is not simulated: use map_mem"
_SYMBOLS = (
    "device symbols, globals and code addresses do not exist: kernels are Python functions "
    "(use binary_load_from_file / binary_get_function)"
)
_FUNC_INFO = "function attributes and parameter layouts are not reported"
_GROUPS = "device resource groups are not simulated"
_MBUF = "mbuf buffers (AI CPU data queues) are not simulated"
_CMO = "cache maintenance operations are not simulated"
_BATCH = "batched copies are not simulated (copy with memcpy / memcpy_async one by one)"
_INTER_SERVER = "sharing between servers is not simulated: the daemon serves one host"
_ID_MAP = "device id mapping is not simulated"
_LAUNCH = (
    "this launch form is not simulated: use launch_kernel, launch_kernel_with_host_args or "
    "launch_kernel_with_config"
)
_SIMT = "SIMT (grid and block) launches are not simulated"
_OVERFLOW = "overflow detection is not simulated"
_UCE = "the simulated device has no memory (UCE) faults to report or repair"
_SNAPSHOT = "process snapshots (backup and restore) are not simulated"
_TASK_INFO = "operator information of tasks is not kept"

CALLS: dict[str, tuple[str, tuple | None, str]] = {
    **_BASIC_CALLS,
    "binary_set_exception_callback": (
        "aclrtBinarySetExceptionCallback",
        None,
        "per-binary exception callbacks are not simulated (use exception_info_callback_register)",
    ),
    "host_mem_map_capabilities": (
        "aclrtHostMemMapCapabilities",
        (0,),
        "mapping host memory into the device is not simulated",
    ),
    "mem_map_no_access": ("aclrtMemMapNoAccess", None, _VMM),
    "mem_p2p_map": ("aclrtMemP2PMap", None, _VMM),
    "mem_map_selected_link": ("aclrtMemMapSelectedLink", None, _VMM),
    "mem_map_set_link": ("aclrtMemMapSetLink", None, _VMM),
    "get_symbol_address": ("aclrtGetSymbolAddress", (0,), _SYMBOLS),
    "get_symbol_size": ("aclrtGetSymbolSize", (0,), _SYMBOLS),
    "memcpy_from_symbol": ("aclrtMemcpyFromSymbol", None, _SYMBOLS),
    "memcpy_from_symbol_async": ("aclrtMemcpyFromSymbolAsync", None, _SYMBOLS),
    "memcpy_to_symbol": ("aclrtMemcpyToSymbol", None, _SYMBOLS),
    "memcpy_to_symbol_async": ("aclrtMemcpyToSymbolAsync", None, _SYMBOLS),
    "binary_get_dev_address": ("aclrtBinaryGetDevAddress", (0, 0), _SYMBOLS),
    "binary_get_function_by_entry": ("aclrtBinaryGetFunctionByEntry", (0,), _SYMBOLS),
    "binary_get_global": ("aclrtBinaryGetGlobal", (0, 0), _SYMBOLS),
    "get_func_by_symbol": ("aclrtGetFuncBySymbol", (0,), _SYMBOLS),
    "get_function_size": ("aclrtGetFunctionSize", (0, 0), _SYMBOLS),
    "get_function_attribute": ("aclrtGetFunctionAttribute", (0,), _FUNC_INFO),
    "function_get_binary": ("aclrtFunctionGetBinary", (0,), _FUNC_INFO),
    "function_get_param_count": ("aclrtFunctionGetParamCount", (0,), _FUNC_INFO),
    "function_get_param_info": ("aclrtFunctionGetParamInfo", (0, 0), _FUNC_INFO),
    "function_get_avail_dyn_ubuf_per_block": (
        "aclrtFunctionGetAvailDynUbufPerBlock",
        (0,),
        "kernels have no unified buffer to size",
    ),
    "set_group": ("aclrtSetGroup", None, _GROUPS),
    "get_group_count": ("aclrtGetGroupCount", (0,), _GROUPS),
    "destroy_group_info": ("aclrtDestroyGroupInfo", None, _GROUPS),
    "get_all_group_info": ("aclrtGetAllGroupInfo", None, _GROUPS),
    "get_group_info_detail": ("aclrtGetGroupInfoDetail", (0,), _GROUPS),
    "get_mem_usage_info": (
        "aclrtGetMemUsageInfo",
        ([],),
        "memory use by runtime module is not reported (get_mem_info reports the device's)",
    ),
    "set_op_execute_timeout_with_ms": (
        "aclrtSetOpExecuteTimeOutWithMs",
        None,
        "only set_op_execute_time_out (seconds) is simulated",
    ),
    "get_mem_uce_info": ("aclrtGetMemUceInfo", ([],), _UCE),
    "mem_uce_repair": ("aclrtMemUceRepair", None, _UCE),
    "repair_error": ("aclrtRepairError", None, "repairing device faults is not simulated"),
    "memcpy_async_with_offset": (
        "aclrtMemcpyAsyncWithOffset",
        None,
        "copies between addresses held in device memory are not simulated",
    ),
    "device_get_pci_bus_id": (
        "aclrtDeviceGetPCIBusId",
        ("",),
        "the simulated device has no PCI bus",
    ),
    "device_get_by_pci_bus_id": (
        "aclrtDeviceGetByPCIBusId",
        (0,),
        "the simulated device has no PCI bus",
    ),
    "device_get_host_atomic_capabilities": (
        "aclrtDeviceGetHostAtomicCapabilities",
        ([],),
        _CAPS,
    ),
    "device_get_p2p_atomic_capabilities": ("aclrtDeviceGetP2PAtomicCapabilities", ([],), _CAPS),
    "device_l2_cache_flush": (
        "aclrtDeviceL2CacheFlush",
        None,
        "the simulated device has no L2 cache",
    ),
    "alloc_buf": ("aclrtAllocBuf", (0,), _MBUF),
    "free_buf": ("aclrtFreeBuf", None, _MBUF),
    "get_buf_data": ("aclrtGetBufData", (0, 0), _MBUF),
    "get_buf_data_len": ("aclrtGetBufDataLen", (0,), _MBUF),
    "set_buf_data_len": ("aclrtSetBufDataLen", None, _MBUF),
    "get_buf_user_data": ("aclrtGetBufUserData", None, _MBUF),
    "set_buf_user_data": ("aclrtSetBufUserData", None, _MBUF),
    "copy_buf_ref": ("aclrtCopyBufRef", (0,), _MBUF),
    "append_buf_chain": ("aclrtAppendBufChain", None, _MBUF),
    "get_buf_chain_num": ("aclrtGetBufChainNum", (0,), _MBUF),
    "get_buf_from_chain": ("aclrtGetBufFromChain", (0,), _MBUF),
    "cmo_async_with_barrier": ("aclrtCmoAsyncWithBarrier", None, _CMO),
    "cmo_wait_barrier": ("aclrtCmoWaitBarrier", None, _CMO),
    "cmo_get_desc_size": ("aclrtCmoGetDescSize", (0,), _CMO),
    "cmo_set_desc": ("aclrtCmoSetDesc", None, _CMO),
    "cmo_async_with_desc": ("aclrtCmoAsyncWithDesc", None, _CMO),
    "memcpy_batch": ("aclrtMemcpyBatch", (0,), _BATCH),
    "memcpy_batch_v2": ("aclrtMemcpyBatchV2", None, _BATCH),
    "memcpy_batch_async": ("aclrtMemcpyBatchAsync", (0,), _BATCH),
    "memcpy_batch_async_v2": ("aclrtMemcpyBatchAsyncV2", None, _BATCH),
    "ipc_mem_set_attr": (
        "aclrtIpcMemSetAttr",
        None,
        "attributes of shared memory are not simulated",
    ),
    "ipc_mem_import_pid_inter_server": ("aclrtIpcMemImportPidInterServer", None, _INTER_SERVER),
    "notify_set_import_pid_inter_server": (
        "aclrtNotifySetImportPidInterServer",
        None,
        _INTER_SERVER,
    ),
    "get_user_dev_id_by_phy_dev_id": ("aclrtGetUserDevIdByPhyDevId", (0,), _ID_MAP),
    "get_phy_dev_id_by_user_dev_id": ("aclrtGetPhyDevIdByUserDevId", (0,), _ID_MAP),
    "prof_trace": ("aclrtProfTrace", None, "profiling is not simulated"),
    "launch_kernel_v2": ("aclrtLaunchKernelV2", None, _LAUNCH),
    "launch_kernel_with_args_array": ("aclrtLaunchKernelWithArgsArray", None, _LAUNCH),
    "launch_simt_kernel_with_args_array": ("aclrtLaunchSIMTKernelWithArgsArray", None, _SIMT),
    "launch_simt_kernel_with_host_args": ("aclrtLaunchSIMTKernelWithHostArgs", None, _SIMT),
    "ctx_get_float_overflow_addr": ("aclrtCtxGetFloatOverflowAddr", (0,), _OVERFLOW),
    "get_float_overflow_status": ("aclrtGetFloatOverflowStatus", None, _OVERFLOW),
    "reset_float_overflow_status": ("aclrtResetFloatOverflowStatus", None, _OVERFLOW),
    "npu_get_float_overflow_status": ("aclrtNpuGetFloatOverFlowStatus", None, _OVERFLOW),
    "npu_clear_float_overflow_status": ("aclrtNpuClearFloatOverFlowStatus", None, _OVERFLOW),
    "get_hardware_sync_addr": (
        "aclrtGetHardwareSyncAddr",
        (0,),
        "hardware synchronization addresses do not exist on the simulated device",
    ),
    "reg_device_state_callback": (
        "aclrtRegDeviceStateCallback",
        None,
        "device state callbacks are not simulated",
    ),
    "set_device_task_abort_callback": (
        "aclrtSetDeviceTaskAbortCallback",
        None,
        "aborting running tasks is not simulated",
    ),
    "task_update_async": (
        "aclrtTaskUpdateAsync",
        None,
        "updating the tasks of a captured model is not simulated",
    ),
    "persistent_task_clean": (
        "aclrtPersistentTaskClean",
        None,
        "persistent streams (tasks kept for a model) are not simulated",
    ),
    "snap_shot_process_lock": ("aclrtSnapShotProcessLock", None, _SNAPSHOT),
    "snap_shot_process_unlock": ("aclrtSnapShotProcessUnlock", None, _SNAPSHOT),
    "snap_shot_process_backup": ("aclrtSnapShotProcessBackup", None, _SNAPSHOT),
    "snap_shot_process_restore": ("aclrtSnapShotProcessRestore", None, _SNAPSHOT),
    "snap_shot_callback_register": ("aclrtSnapShotCallbackRegister", None, _SNAPSHOT),
    "snap_shot_callback_unregister": ("aclrtSnapShotCallbackUnregister", None, _SNAPSHOT),
    "cache_last_task_op_info": ("aclrtCacheLastTaskOpInfo", None, _TASK_INFO),
    "cache_last_task_extend_info": ("aclrtCacheLastTaskExtendInfo", None, _TASK_INFO),
    "allocator_get_by_stream": (
        "aclrtAllocatorGetByStream",
        (0, 0, 0, 0, 0, 0),
        "user allocators for streams are not simulated",
    ),
}
# C calls that return a value and no aclError: pyACL returns just that value.
# C calls that return a value and no aclError: pyACL returns just that value.
VALUES: dict[str, tuple[str, object, str]] = {
    **_BASIC_VALUES,
    "create_group_info": ("aclrtCreateGroupInfo", 0, _GROUPS),
}
