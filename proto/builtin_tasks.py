"""What both sides know of the built-in device tasks: aclrtReduceAsync's kinds and data
types, aclrtRandomNumAsync's generators, data types and parameters, and the checks both
sides make (the client at once, the daemon again on the record it decodes).

The codes are the CANN runtime's: a data type the ACL layer does not map is 100000
(ACL_ERROR_INVALID_PARAM); what the runtime's checks refuse is 107000
(ACL_ERROR_RT_PARAM_INVALID); a kind or data type the device cannot do is 207000
(ACL_ERROR_RT_FEATURE_NOT_SUPPORT), as on a SoC whose capabilities lack it.
"""

from __future__ import annotations

from typing import NamedTuple

from simnpu.proto import codes
from simnpu.proto.errors import NpuError, invalid

# ---- aclrtReduceAsync -------------------------------------------------------------------------
REDUCE_KINDS = range(
    codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM, codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_EQUAL + 1
)
"""The runtime's range of aclrtReduceKind (its RT_RECUDE_KIND_END is 14)."""
MAX_SUM_BYTES = 4 << 30  # the runtime's MAX_MEMCPY_SIZE_OF_D2D: a SUM's count is at most this

REDUCE_TYPES: dict[int, str] = {
    codes.ACL_FLOAT: "float32",
    codes.ACL_FLOAT16: "float16",
    codes.ACL_INT16: "int16",
    codes.ACL_INT4: "int4",
    codes.ACL_INT8: "int8",
    codes.ACL_INT32: "int32",
    codes.ACL_BF16: "bfloat16",
    codes.ACL_UINT8: "uint8",
    codes.ACL_UINT16: "uint16",
    codes.ACL_UINT32: "uint32",
}
"""The aclDataTypes the ACL layer maps for aclrtReduceAsync, as numpy dtype names."""


def check_reduce(count: int, kind: int, data_type: int, dst: int, src: int) -> str:
    """The numpy dtype name of a reduce's elements, or the NpuError the runtime gives."""
    name = REDUCE_TYPES.get(data_type)
    if name is None:
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM,
            f"aclrtReduceAsync data type {data_type}: the data type is not supported",
        )
    if count == 0:
        raise invalid("aclrtReduceAsync count is 0")
    if kind not in REDUCE_KINDS:
        raise invalid(f"aclrtReduceAsync kind {kind}: the range is [10, 14)")
    if kind == codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM and count > MAX_SUM_BYTES:
        raise invalid(f"aclrtReduceAsync SUM of {count} bytes: the range of count is (0, 4 GiB]")
    if kind == codes.ACL_RT_MEMCPY_SDMA_AUTOMATIC_EQUAL:
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "aclrtReduceAsync kind ACL_RT_MEMCPY_SDMA_AUTOMATIC_EQUAL (13) is not simulated: "
            "the simulated device does not support this kind of reduction",
        )
    if name == "int4":
        raise NpuError(
            codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "aclrtReduceAsync of ACL_INT4 is not simulated: the simulated device does not "
            "support the reduction of this data type",
        )
    size = element_size(name)
    for what, address in (("src", src), ("dst", dst)):
        if address % size:
            raise invalid(f"aclrtReduceAsync {what} {address:#x} is not {size}-byte aligned")
    if count % size:
        raise invalid(f"aclrtReduceAsync count {count} is not a whole number of {name} elements")
    return name


def element_size(name: str) -> int:
    """Bytes per element of a numpy dtype name ("bfloat16" included)."""
    return 2 if name == "bfloat16" else int(name[-2:] if name[-2:].isdigit() else name[-1]) // 8


# ---- aclrtRandomNumAsync ----------------------------------------------------------------------
RANDOM_TYPES: dict[int, str] = {
    codes.ACL_INT32: "int32",
    codes.ACL_INT64: "int64",
    codes.ACL_UINT32: "uint32",
    codes.ACL_UINT64: "uint64",
    codes.ACL_BF16: "bfloat16",
    codes.ACL_FLOAT16: "float16",
    codes.ACL_FLOAT: "float32",
}
"""The aclDataTypes the ACL layer maps for aclrtRandomNumAsync."""

_FLOATS = frozenset({codes.ACL_BF16, codes.ACL_FLOAT16, codes.ACL_FLOAT})
RANDOM_FUNCTIONS: dict[int, frozenset[int]] = {
    codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_DROPOUT_BITMASK: _FLOATS,
    codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_UNIFORM_DIS: frozenset(RANDOM_TYPES),
    codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_NORMAL_DIS: _FLOATS,
    codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_TRUNCATED_NORMAL_DIS: _FLOATS,
}
"""aclrtRandomNumFuncType -> the data types it generates (the runtime's table)."""

RANDOM_PARAMETERS: dict[int, tuple[str, ...]] = {
    codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_DROPOUT_BITMASK: ("dropout_ration",),
    codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_UNIFORM_DIS: ("min", "max"),
    codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_NORMAL_DIS: ("mean", "stddev"),
    codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_TRUNCATED_NORMAL_DIS: ("mean", "stddev"),
}
"""The parameters of each generator, in the order of its member of the paramInfo union."""

COUNTER_BYTES = 16  # the Philox counter: 128 bits at randomCounterAddr
WORD_BYTES = 8  # aclrtRandomParaInfo.valueOrAddr; the seed and the count are 64-bit


class RandomParameter(NamedTuple):
    """An aclrtRandomParaInfo: `value` is valueOrAddr's 8 bytes (an address when is_addr)."""

    is_addr: int
    value: bytes
    size: int

    @property
    def address(self) -> int:
        return int.from_bytes(self.value, "little")


def check_random(
    data_type: int,
    func_type: int,
    result: int,
    counter: int,
    parameters: tuple[RandomParameter, ...],
    seed: RandomParameter,
    num: RandomParameter,
) -> str:
    """The numpy dtype name of a random number task's data type, or the NpuError the
    runtime gives. `parameters` are the generator's (RANDOM_PARAMETERS), in order."""
    name = RANDOM_TYPES.get(data_type)
    if name is None:
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM,
            f"aclrtRandomNumAsync dataType {data_type}: the data type is not supported",
        )
    allowed = RANDOM_FUNCTIONS.get(func_type)
    if allowed is None:
        raise invalid(f"aclrtRandomNumAsync funcType {func_type}: the range is [0, 4)")
    if data_type not in allowed:
        raise invalid(
            f"aclrtRandomNumAsync funcType {func_type} does not generate data type {data_type}"
        )
    if not counter:
        raise invalid("aclrtRandomNumAsync randomCounterAddr is null")
    if not result:
        raise invalid("aclrtRandomNumAsync randomResultAddr is null")
    _check_parameter("randomSeed", seed, WORD_BYTES)
    _check_parameter("randomNum", num, WORD_BYTES)
    size = element_size(name)
    for field, parameter in zip(RANDOM_PARAMETERS[func_type], parameters):
        _check_parameter(field, parameter, WORD_BYTES if parameter.is_addr else size)
    return name


def _check_parameter(field: str, parameter: RandomParameter, most: int) -> None:
    if parameter.is_addr not in (0, 1):
        raise invalid(f"aclrtRandomNumAsync {field}.isAddr {parameter.is_addr}: use 0 or 1")
    if not 1 <= parameter.size <= most:
        raise invalid(
            f"aclrtRandomNumAsync {field}.size {parameter.size}: the range is [1, {most}]"
        )
    if parameter.is_addr and not parameter.address:
        raise invalid(f"aclrtRandomNumAsync {field} is an address and it is null")
