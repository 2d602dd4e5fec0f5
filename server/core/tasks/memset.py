"""A memset (aclrtMemsetAsync, aclrtMemset) on copy engines, cut as copies are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.server.core.tasks.base import size_text
from simnpu.server.core.tasks.copy import ByteRangeWork, span_access
from simnpu.server.core.unit_protocol import FillBytes, Span

if TYPE_CHECKING:
    from simnpu.server.core.streams import Stream


class MemsetTask(ByteRangeWork):
    __slots__ = ("dst", "value")
    kind = "memset"

    def __init__(self, seq: int, stream: Stream, dst: Span, value: int, count: int):
        super().__init__(seq, stream, count)
        self.dst = dst
        self.value = value  # the byte

    def piece(self, token: int, start: int, end: int) -> tuple:
        return FillBytes.pack(token, self.dst.at(start), self.value, end - start)

    def describe(self) -> tuple[str, str, dict]:
        return (
            f"memset {size_text(self.count)}",
            "memset",
            {"bytes": self.count, "value": self.value},
        )

    def timeline_entry(self) -> tuple[str | None, int]:
        return None, self.count

    def accesses(self) -> list[tuple]:
        return [span_access(self.dst, self.count, True)]
