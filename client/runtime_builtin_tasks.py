"""The raw layer's built-in device tasks: aclrtReduceAsync (dst = dst (op) src on a copy
engine) and aclrtRandomNumAsync (simnpu's Philox generator: server/random_numbers.py).

A mixin of `Runtime` (client/runtime.py). What the host can check -- kinds, data types,
parameters, that the ranges lie in allocations of this process -- it checks at once, with
the runtime's codes (simnpu.proto.builtin_tasks); the daemon checks it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.transport import caller_site
from simnpu.proto import builtin_tasks, codes, commands
from simnpu.proto.builtin_tasks import COUNTER_BYTES, WORD_BYTES, RandomParameter
from simnpu.proto.errors import NpuError, invalid

if TYPE_CHECKING:
    from simnpu.client.transport import Connection

_UNION = {
    "dropout_bitmask_info": ("dropout_ration",),
    "uniform_dis_info": ("min", "max"),
    "normal_dis_info": ("mean", "stddev"),
}
"""The members of aclrtRandomNumFuncParaInfo's paramInfo union and their parameters."""


class RuntimeBuiltinTasks:
    # what the mixin uses of Runtime (client/runtime.py), which sets all of it
    connection: Connection

    if TYPE_CHECKING:

        def stream(self, handle: int) -> int: ...
        def device_range(self, address: int, count: int) -> None: ...

    @records_errors
    def reduce_async(
        self, dst: int, src: int, count: int, kind: int, data_type: int, stream: int, reserve: int
    ) -> None:
        """aclrtReduceAsync (async): dst = dst (op) src element-wise over `count` bytes."""
        if reserve:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "aclrtReduceAsync reserve must be null")
        builtin_tasks.check_reduce(count, kind, data_type, dst, src)
        stream = self.stream(stream)
        self.device_range(dst, count)
        self.device_range(src, count)
        self.connection.send_command(
            commands.Reduce.pack(stream, dst, src, count, kind, data_type), caller_site(), stream
        )

    @records_errors
    def random_num_async(self, task_info: dict, stream: int, reserve: int) -> None:
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
        stream = self.stream(stream)
        size = builtin_tasks.element_size(dtype)
        self.device_range(counter, COUNTER_BYTES)
        self.device_range(result, 1)
        if not num.is_addr:
            amount = int.from_bytes(num.value[: num.size], "little")
            if func_type == codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_DROPOUT_BITMASK:
                self.device_range(result, max(1, -(-amount // 8)))
            else:
                self.device_range(result, max(1, amount * size))
        for parameter, nbytes in (*((p, size) for p in parameters), (seed, 8), (num, 8)):
            if parameter.is_addr:
                self.device_range(parameter.address, nbytes)
        self.connection.send_command(
            commands.RandomNum.pack(
                stream, data_type, func_type, result, counter, parameters, seed, num
            ),
            caller_site(),
            stream,
        )


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
