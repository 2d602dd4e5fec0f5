"""aclrtRandomNumAsync on a copy engine: simnpu's own Philox4x32-10 generator.

The runtime documents Philox4_32_10 with a 128-bit counter in device memory; simnpu uses
that algorithm (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) but
not the hardware's bit stream, nor its conversions to distributions. A task:

* keys Philox with the 64-bit seed (low word first) and reads the counter, a little-endian
  128-bit integer at randomCounterAddr; block i of the task is Philox(counter + i), four
  32-bit words; after the task the counter is advanced by the blocks it used, so the next
  task with the same counter memory continues the stream and the same seed and counter
  always give the same numbers;
* uniform floats: u = (word >> 8) / 2**24 in [0, 1), min + u * (max - min) computed in
  float32, then rounded to the data type; uniform integers: min + word % (max - min)
  (64-bit words, two 32-bit words each, for the 64-bit types), in [min, max); all min when
  max <= min;
* normal: Box-Muller on pairs of words, mean + stddev * z, computed in float32; truncated
  normal redraws every z outside [-2, 2] from the following blocks until none is;
* dropout bitmask: num bits, bit i (LSB first in each byte) is 1 -- kept -- when its
  uniform u >= ratio: ceil(num / 8) bytes.

Runs in a worker on the unit's device mappings (by segment name).
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import numpy as np

from simnpu.proto import codes
from simnpu.proto.builtin_tasks import COUNTER_BYTES, WORD_BYTES
from simnpu.server.core.unit_protocol import RandomNumbers, Result, Span
from simnpu.server.units.reduce_async import dtype

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = np.uint64(0xFFFFFFFF)
_TRUNCATION = 2.0  # a truncated normal keeps |z| <= 2 standard deviations


def philox(key: int, counter: int, blocks: int) -> np.ndarray:
    """4 * blocks 32-bit words: Philox4x32-10 of counters counter .. counter + blocks - 1."""
    index = np.arange(blocks, dtype=np.uint64)
    low = counter & 0xFFFFFFFFFFFFFFFF
    ends = np.uint64(low) + index  # wraps into the high half when it carries
    carry = (ends < np.uint64(low)).astype(np.uint64)
    high = (np.uint64(counter >> 64) + carry) & np.uint64(0xFFFFFFFFFFFFFFFF)
    c0, c1 = ends & _MASK, ends >> np.uint64(32)
    c2, c3 = high & _MASK, high >> np.uint64(32)
    k0, k1 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0),
            p1 & _MASK,
            (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1),
            p0 & _MASK,
        )
        k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3], axis=1).reshape(-1).astype(np.uint32)


class _Stream:
    """The words of one task: blocks taken from the counter on, in order."""

    def __init__(self, key: int, counter: int):
        self.key, self.counter, self.used = key, counter, 0

    def words(self, count: int) -> np.ndarray:
        blocks = -(-count // 4)
        out = philox(self.key, self.counter + self.used, blocks)[:count]
        self.used += blocks
        return out


def _uniform(words: np.ndarray) -> np.ndarray:
    return (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)


def _normal(stream: _Stream, count: int) -> np.ndarray:
    pairs = -(-count // 2)
    words = stream.words(2 * pairs).reshape(-1, 2)
    u1 = ((words[:, 0] >> np.uint32(8)).astype(np.float64) + 1.0) * 2.0**-24  # (0, 1]
    u2 = _uniform(words[:, 1]).astype(np.float64)
    radius = np.sqrt(-2.0 * np.log(u1))
    angle = 2.0 * np.pi * u2
    return np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).reshape(-1)[:count]


def _truncated(stream: _Stream, count: int) -> np.ndarray:
    z = _normal(stream, count)
    outside = np.flatnonzero(np.abs(z) > _TRUNCATION)
    while outside.size:
        z[outside] = _normal(stream, outside.size)
        outside = outside[np.abs(z[outside]) > _TRUNCATION]
    return z


def _scalar(maps: dict, parameter: tuple, kind: np.dtype) -> Any:
    """A parameter's value as `kind`: its bytes, or read from device memory."""
    if len(parameter) == 1:
        span = Span(*parameter[0])
        raw = bytes(maps[span.segment][span.offset : span.offset + kind.itemsize])
    else:
        value, size = parameter
        raw = (value[:size] + bytes(WORD_BYTES))[: kind.itemsize]
    return np.frombuffer(raw, kind, 1)[0]


def generate(func_type: int, kind: np.dtype, parameters: list, num: int, stream: _Stream):
    """The result's bytes."""
    if func_type == codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_DROPOUT_BITMASK:
        keep = _uniform(stream.words(num)) >= np.float32(parameters[0])
        return np.packbits(keep, bitorder="little").tobytes()
    if func_type == codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_UNIFORM_DIS:
        low, high = parameters
        if kind.kind in "iu":
            span = int(high) - int(low)
            if span <= 0:
                return np.full(num, low, kind).tobytes()
            if kind.itemsize == 8:
                pairs = stream.words(2 * num).astype(np.uint64).reshape(-1, 2)
                words = [int(a) | int(b) << 32 for a, b in pairs]
            else:
                words = [int(w) for w in stream.words(num)]
            return np.array([int(low) + w % span for w in words], kind).tobytes()
        u = _uniform(stream.words(num))
        low32, high32 = np.float32(low), np.float32(high)
        return (low32 + u * (high32 - low32)).astype(kind).tobytes()
    mean, stddev = (np.float32(p) for p in parameters)
    if func_type == codes.ACL_RT_RANDOM_NUM_FUNC_TYPE_NORMAL_DIS:
        z = _normal(stream, num)
    else:
        z = _truncated(stream, num)
    return (mean + np.float32(stddev) * z.astype(np.float32)).astype(kind).tobytes()


def execute(maps: dict, item: RandomNumbers) -> Result:
    """Run one random number task."""
    start = time.monotonic_ns()
    try:
        kind = dtype(item.dtype)
        u64 = np.dtype("<u8")
        parameters = [_scalar(maps, p, kind) for p in item.parameters]
        seed = int(_scalar(maps, item.seed, u64))
        num = int(_scalar(maps, item.num, u64))
        counter_memory = maps[item.counter.segment]
        at = item.counter.offset
        counter = int.from_bytes(counter_memory[at : at + COUNTER_BYTES], "little")
        stream = _Stream(seed, counter)
        needed = -(-num // 8) if item.func_type == 0 else num * kind.itemsize
        if needed > item.room:
            return Result(
                item.token,
                codes.ACL_ERROR_RT_DEVICE_MEM_ERROR,
                start,
                time.monotonic_ns(),
                f"random number task: {num} numbers need {needed} bytes at the result, "
                f"its allocation has {item.room}",
            )
        with np.errstate(all="ignore"):
            data = generate(item.func_type, kind, parameters, num, stream)
        result = maps[item.result.segment]
        result[item.result.offset : item.result.offset + len(data)] = data
        advanced = (counter + stream.used) % (1 << 128)
        counter_memory[at : at + COUNTER_BYTES] = advanced.to_bytes(COUNTER_BYTES, "little")
    except BaseException as exc:
        return Result(
            item.token,
            codes.ACL_ERROR_RT_SYS_DMA,
            start,
            time.monotonic_ns(),
            "random number task failed:\n" + "".join(traceback.format_exception(exc)),
        )
    return Result(item.token, 0, start, time.monotonic_ns(), "")
