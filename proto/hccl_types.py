"""HCCL's enums with their real values (hccl_types.h), and what both sides need of them.

The daemon and the client share this table: the wire carries HcclDataType, HcclReduceOp
and HcclCMDType values unchanged, and the daemon replies to HCCL requests with HcclResult
codes. No numpy here: data types are named, and mapped to numpy dtypes where data moves.
"""

from __future__ import annotations

# ---- HcclResult -------------------------------------------------------------------------
HCCL_SUCCESS = 0
HCCL_E_PARA = 1
HCCL_E_PTR = 2
HCCL_E_MEMORY = 3
HCCL_E_INTERNAL = 4
HCCL_E_NOT_SUPPORT = 5
HCCL_E_NOT_FOUND = 6
HCCL_E_UNAVAIL = 7
HCCL_E_SYSCALL = 8
HCCL_E_TIMEOUT = 9
HCCL_E_OPEN_FILE_FAILURE = 10
HCCL_E_TCP_CONNECT = 11
HCCL_E_ROCE_CONNECT = 12
HCCL_E_TCP_TRANSFER = 13
HCCL_E_ROCE_TRANSFER = 14
HCCL_E_RUNTIME = 15
HCCL_E_DRV = 16
HCCL_E_PROFILING = 17
HCCL_E_CCE = 18
HCCL_E_NETWORK = 19
HCCL_E_AGAIN = 20
HCCL_E_REMOTE = 21
HCCL_E_SUSPENDING = 22
HCCL_E_OPRETRY_FAIL = 23
HCCL_E_OOM = 24
HCCL_E_RESERVED = 25

# ---- HcclDataType -----------------------------------------------------------------------
HCCL_DATA_TYPE_INT8 = 0
HCCL_DATA_TYPE_INT16 = 1
HCCL_DATA_TYPE_INT32 = 2
HCCL_DATA_TYPE_FP16 = 3
HCCL_DATA_TYPE_FP32 = 4
HCCL_DATA_TYPE_INT64 = 5
HCCL_DATA_TYPE_UINT64 = 6
HCCL_DATA_TYPE_UINT8 = 7
HCCL_DATA_TYPE_UINT16 = 8
HCCL_DATA_TYPE_UINT32 = 9
HCCL_DATA_TYPE_FP64 = 10
HCCL_DATA_TYPE_BFP16 = 11
HCCL_DATA_TYPE_INT128 = 12
HCCL_DATA_TYPE_HIF8 = 14
HCCL_DATA_TYPE_FP8E4M3 = 15
HCCL_DATA_TYPE_FP8E5M2 = 16
HCCL_DATA_TYPE_FP8E8M0 = 17
HCCL_DATA_TYPE_RESERVED = 255

# ---- HcclReduceOp -----------------------------------------------------------------------
HCCL_REDUCE_SUM = 0
HCCL_REDUCE_PROD = 1
HCCL_REDUCE_MAX = 2
HCCL_REDUCE_MIN = 3
HCCL_REDUCE_RESERVED = 255

# ---- HcclCMDType (the collective a task runs) ------------------------------------------
HCCL_CMD_INVALID = 0
HCCL_CMD_BROADCAST = 1
HCCL_CMD_ALLREDUCE = 2
HCCL_CMD_REDUCE = 3
HCCL_CMD_SEND = 4
HCCL_CMD_RECEIVE = 5
HCCL_CMD_ALLGATHER = 6
HCCL_CMD_REDUCE_SCATTER = 7
HCCL_CMD_ALLTOALL = 10
HCCL_CMD_SCATTER = 12
HCCL_CMD_BARRIER = 103

HCCL_ROOT_INFO_BYTES = 4108
MAX_RANKS = 4096  # the most ranks of one communicator (a simnpu limit)
HCCL_COMM_NAME_MAX_LENGTH = 128

# ---- what simnpu supports ---------------------------------------------------------------
# HcclDataType -> numpy dtype name ("bfloat16" comes from ml_dtypes) and element size.
DTYPE_NAMES = {
    HCCL_DATA_TYPE_INT8: "int8",
    HCCL_DATA_TYPE_INT16: "int16",
    HCCL_DATA_TYPE_INT32: "int32",
    HCCL_DATA_TYPE_INT64: "int64",
    HCCL_DATA_TYPE_UINT8: "uint8",
    HCCL_DATA_TYPE_UINT16: "uint16",
    HCCL_DATA_TYPE_UINT32: "uint32",
    HCCL_DATA_TYPE_UINT64: "uint64",
    HCCL_DATA_TYPE_FP16: "float16",
    HCCL_DATA_TYPE_FP32: "float32",
    HCCL_DATA_TYPE_FP64: "float64",
    HCCL_DATA_TYPE_BFP16: "bfloat16",
}
ITEM_SIZES = {
    HCCL_DATA_TYPE_INT8: 1,
    HCCL_DATA_TYPE_INT16: 2,
    HCCL_DATA_TYPE_INT32: 4,
    HCCL_DATA_TYPE_INT64: 8,
    HCCL_DATA_TYPE_UINT8: 1,
    HCCL_DATA_TYPE_UINT16: 2,
    HCCL_DATA_TYPE_UINT32: 4,
    HCCL_DATA_TYPE_UINT64: 8,
    HCCL_DATA_TYPE_FP16: 2,
    HCCL_DATA_TYPE_FP32: 4,
    HCCL_DATA_TYPE_FP64: 8,
    HCCL_DATA_TYPE_BFP16: 2,
}
KNOWN_DTYPES = set(DTYPE_NAMES) | {
    HCCL_DATA_TYPE_INT128,
    HCCL_DATA_TYPE_HIF8,
    HCCL_DATA_TYPE_FP8E4M3,
    HCCL_DATA_TYPE_FP8E5M2,
    HCCL_DATA_TYPE_FP8E8M0,
}
SHORT_DTYPE_NAMES = {  # as messages print them
    HCCL_DATA_TYPE_INT8: "int8",
    HCCL_DATA_TYPE_INT16: "int16",
    HCCL_DATA_TYPE_INT32: "int32",
    HCCL_DATA_TYPE_INT64: "int64",
    HCCL_DATA_TYPE_UINT8: "uint8",
    HCCL_DATA_TYPE_UINT16: "uint16",
    HCCL_DATA_TYPE_UINT32: "uint32",
    HCCL_DATA_TYPE_UINT64: "uint64",
    HCCL_DATA_TYPE_FP16: "fp16",
    HCCL_DATA_TYPE_FP32: "fp32",
    HCCL_DATA_TYPE_FP64: "fp64",
    HCCL_DATA_TYPE_BFP16: "bf16",
    HCCL_DATA_TYPE_INT128: "int128",
    HCCL_DATA_TYPE_HIF8: "hif8",
    HCCL_DATA_TYPE_FP8E4M3: "fp8e4m3",
    HCCL_DATA_TYPE_FP8E5M2: "fp8e5m2",
    HCCL_DATA_TYPE_FP8E8M0: "fp8e8m0",
}
REDUCE_OP_NAMES = {
    HCCL_REDUCE_SUM: "sum",
    HCCL_REDUCE_PROD: "prod",
    HCCL_REDUCE_MAX: "max",
    HCCL_REDUCE_MIN: "min",
}
COLLECTIVE_NAMES = {
    HCCL_CMD_BROADCAST: "broadcast",
    HCCL_CMD_ALLREDUCE: "all_reduce",
    HCCL_CMD_REDUCE: "reduce",
    HCCL_CMD_SEND: "send",
    HCCL_CMD_RECEIVE: "recv",
    HCCL_CMD_ALLGATHER: "all_gather",
    HCCL_CMD_REDUCE_SCATTER: "reduce_scatter",
    HCCL_CMD_ALLTOALL: "alltoall",
    HCCL_CMD_SCATTER: "scatter",
    HCCL_CMD_BARRIER: "barrier",
}
REDUCING = (HCCL_CMD_ALLREDUCE, HCCL_CMD_REDUCE, HCCL_CMD_REDUCE_SCATTER)
ROOTED = (HCCL_CMD_BROADCAST, HCCL_CMD_REDUCE, HCCL_CMD_SCATTER)
POINT_TO_POINT = (HCCL_CMD_SEND, HCCL_CMD_RECEIVE)

# ---- environment (read by the client, seconds) ------------------------------------------
EXEC_TIMEOUT_ENV = "HCCL_EXEC_TIMEOUT"  # default 1836 s as HCCL's AI-CPU mode; 0 = never
CONNECT_TIMEOUT_ENV = "HCCL_CONNECT_TIMEOUT"  # default 120 s
DEFAULT_EXEC_TIMEOUT_S = 1836.0
DEFAULT_CONNECT_TIMEOUT_S = 120.0

_RESULT_NAMES = {
    value: name
    for name, value in sorted(globals().items())
    if name.startswith("HCCL_E_") or name == "HCCL_SUCCESS"
}


def result_name(code: int) -> str:
    """ "HCCL_E_TIMEOUT" for 9; "UNKNOWN(<code>)" for what is not an HcclResult."""
    return _RESULT_NAMES.get(code, f"UNKNOWN({code})")


def is_result(code: int) -> bool:
    """True for an HcclResult (as opposed to an ACL code, which is 0 or >= 100000)."""
    return 0 <= code < 100


_DESCRIPTIONS = {
    HCCL_SUCCESS: "success",
    HCCL_E_PARA: "parameter error",
    HCCL_E_PTR: "empty pointer",
    HCCL_E_MEMORY: "memory error",
    HCCL_E_INTERNAL: "internal error",
    HCCL_E_NOT_SUPPORT: "not support feature",
    HCCL_E_NOT_FOUND: "not found specific resource",
    HCCL_E_UNAVAIL: "resource unavailable",
    HCCL_E_SYSCALL: "call system interface error",
    HCCL_E_TIMEOUT: "timeout",
    HCCL_E_OPEN_FILE_FAILURE: "open file fail",
    HCCL_E_TCP_CONNECT: "tcp connect fail",
    HCCL_E_ROCE_CONNECT: "roce connect fail",
    HCCL_E_TCP_TRANSFER: "tcp transfer fail",
    HCCL_E_ROCE_TRANSFER: "roce transfer fail",
    HCCL_E_RUNTIME: "call runtime api fail",
    HCCL_E_DRV: "call driver api fail",
    HCCL_E_PROFILING: "call profiling api fail",
    HCCL_E_CCE: "call cce api fail",
    HCCL_E_NETWORK: "call network api fail",
    HCCL_E_AGAIN: "try again",
    HCCL_E_REMOTE: "error cqe",
    HCCL_E_SUSPENDING: "error communicator suspending",
    HCCL_E_OPRETRY_FAIL: "retry constraint",
    HCCL_E_OOM: "out of memory",
}


def describe_result(code: int) -> str:
    """HcclGetErrorString: a short description of an HcclResult."""
    return _DESCRIPTIONS.get(code, "unknown error")
