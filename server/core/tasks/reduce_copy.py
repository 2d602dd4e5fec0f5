"""A reduce (aclrtReduceAsync) on copy engines: dst = dst (op) src element-wise, cut as
copies are (server/units/reduce_async.py runs a piece)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.server.core.tasks.base import size_text
from simnpu.server.core.tasks.copy import ByteRangeWork, span_access
from simnpu.server.core.unit_protocol import ReduceBytes, Span

if TYPE_CHECKING:
    from simnpu.server.core.streams import Stream


class ReduceCopyTask(ByteRangeWork):
    __slots__ = ("dst", "dtype", "reduce_kind", "src")
    kind = "reduce"

    def __init__(
        self, seq: int, stream: Stream, dst: Span, src: Span, count: int, kind: int, dtype: str
    ):
        super().__init__(seq, stream, count)
        self.dst = dst
        self.src = src
        self.reduce_kind = kind  # aclrtReduceKind
        self.dtype = dtype  # numpy dtype name

    def piece(self, token: int, start: int, end: int) -> tuple:
        return ReduceBytes.pack(
            token,
            self.dst.at(start),
            self.src.at(start),
            end - start,
            self.reduce_kind,
            self.dtype,
            self.stream.saturation,
        )

    def describe(self) -> tuple[str, str, dict]:
        return (
            f"reduce {self.dtype} {size_text(self.count)}",
            "copy",
            {"bytes": self.count, "kind": self.reduce_kind},
        )

    def timeline_entry(self) -> tuple[str | None, int]:
        return "reduce", self.count

    def accesses(self) -> list[tuple]:
        return [span_access(self.src, self.count, False), span_access(self.dst, self.count, True)]
