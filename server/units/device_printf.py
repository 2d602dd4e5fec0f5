"""Device printf: what kernels print (`ctx.printf`, `print` in a kernel module) reaches the
client that launched them, as AscendC::printf output does (docs/acl.md, "Device printf").

A unit collects a launch's output per block in a `KernelOutput` (bounded: TASK_SPACE
characters per piece of a launch, BATCH_SPACE per batch), formatted as the real runtime's
dump parser prints it: a DumpHead line per block that printed, then its text. It travels
in the piece's Result (TASK_SPACE and the other bounds of what a result carries are the unit
protocol's, server/core/unit_protocol.py); the daemon keeps a client's output in its
`PendingOutput` (server/core/owner.py) until a synchronize's reply takes it, in task order.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from simnpu.server.core.unit_protocol import INCOMPLETE, TASK_SPACE

BATCH_SPACE = 128 << 10
"""Characters all the launches of one batch may print together."""

MAGIC = 0x5AA5BCCD  # the real dump's magic number, printed in every DumpHead
OFF_LIMIT_RSV = 7  # the real dump's rsv of a block whose space ran out


class KernelOutput:
    """What the blocks of a unit's kernel piece print: `start` a piece, `block` as each block
    starts, `write` text, `finish` for the piece's formatted output. Never blocks: text past
    the space is dropped and the block's DumpHead says so (rsv=7)."""

    __slots__ = (
        "_batch_left",
        "_block",
        "_blocks",
        "_cut",
        "_left",
        "_name",
        "_noted",
        "_num",
        "_text",
    )

    def __init__(self) -> None:
        self._batch_left = BATCH_SPACE
        self._blocks: list[str] = []
        self._text: list[str] = []
        self._block = -1  # the block running (-1: none: writes are dropped)
        self._cut = False  # the running block lost text
        self._noted = False  # a DumpHead of this piece said the space ran out
        self._left = 0
        self._name = ""
        self._num = 0

    def new_batch(self) -> None:
        self._batch_left = BATCH_SPACE

    def start(self, name: str, num_blocks: int) -> None:
        self._name, self._num = name, num_blocks
        self._left = min(TASK_SPACE, self._batch_left)
        self._blocks = []
        self._block = -1
        self._noted = False

    def block(self, index: int) -> None:
        """Block `index` starts (the previous one, if any, is done)."""
        if self._block >= 0:
            self._end_block()
        self._block, self._text, self._cut = index, [], False

    def write(self, text: str) -> None:
        if self._block < 0 or not text:
            return
        left = self._left
        if len(text) > left:
            self._cut = True
            text = text[: max(left, 0)]
            if not text:
                return
        self._left = left - len(text)
        self._text.append(text)

    def print(self, *values: Any, sep: str | None = " ", end: str | None = "\n", **kw: Any) -> None:
        """`print` as a kernel module sees it: to the launch's output (to a file if given)."""
        if kw.get("file") is not None:
            print(*values, sep=sep, end=end, **kw)
            return
        sep = " " if sep is None else sep
        end = "\n" if end is None else end
        self.write(sep.join(map(str, values)) + end)

    def printf(self, fmt: str, *args: Any) -> None:
        """`ctx.printf`: a C format (%d %i %u %x %X %o %f %e %g %c %s %p %%, with C's flags,
        width, precision and length modifiers)."""
        self.write(c_format(fmt, args))

    def finish(self) -> str:
        """The piece's output, formatted (its DumpHeads included); "" if nothing printed."""
        if self._block >= 0:
            self._end_block()
            self._block = -1
        if not self._blocks:
            return ""
        out = "".join(self._blocks)
        self._blocks = []
        self._batch_left -= min(len(out), self._batch_left)
        return out

    def _end_block(self) -> None:
        if not self._text and (not self._cut or self._noted):
            return  # nothing printed, or nothing fitted and a DumpHead said so already
        self._noted |= self._cut
        rsv = OFF_LIMIT_RSV if self._cut else 0
        head = (
            (INCOMPLETE if self._cut else "")
            + f"opType={self._name}, DumpHead: AIV-{self._block}, CoreType=AIV, "
            f"block dim={self._num}, total_block_num={self._num}, "
            f"block_remain_len={max(self._left, 0)}, block_initial_space={TASK_SPACE}, "
            f"rsv={rsv}, magic={MAGIC:x}\n"
        )
        self._left -= len(head)
        self._blocks.append(head + "".join(self._text))


_CONVERSION = re.compile(
    r"%(?P<flags>[-+ #0]*)(?P<width>\d+|\*)?(?:\.(?P<precision>\d+|\*))?"
    r"(?:hh|h|ll|l|z|j|t|L)?(?P<kind>[diouxXeEfFgGaAcsp%])"
)


@functools.lru_cache(maxsize=256)
def _parse(fmt: str) -> tuple[tuple[str, str, str], ...]:
    """`fmt` as (literal text before, Python conversion spec, C conversion kind) parts; the
    last part has an empty kind (the text after the last conversion)."""
    parts = []
    at = 0
    for match in _CONVERSION.finditer(fmt):
        kind = match["kind"]
        if kind == "%":
            parts.append((fmt[at : match.start()] + "%", "", ""))
        else:
            spec = "%" + match["flags"] + (match["width"] or "")
            if match["precision"] is not None:
                spec += "." + match["precision"]
            parts.append((fmt[at : match.start()], spec, kind))
        at = match.end()
    parts.append((fmt[at:], "", ""))
    return tuple(parts)


def c_format(fmt: str, args: tuple) -> str:
    """`fmt` (a C printf format) applied to `args`. Raises ValueError when the arguments do
    not match the conversions (C would print garbage)."""
    if not isinstance(fmt, str):
        raise TypeError(f"printf's format must be str, not {type(fmt).__name__}")
    out = []
    values = list(args)
    for literal, spec, kind in _parse(fmt):
        out.append(literal)
        if not kind:
            continue
        stars = spec.count("*")
        if len(values) < stars + 1:
            raise ValueError(
                f"printf format {fmt!r} needs more arguments than the {len(args)} given"
            )
        for _ in range(stars):
            spec = spec.replace("*", str(int(values.pop(0))), 1)
        value = values.pop(0)
        if kind in "diu":
            out.append((spec + "d") % int(value))
        elif kind in "oxX":
            out.append((spec + kind) % int(value))
        elif kind == "p":
            out.append((spec + "s") % hex(int(value)))
        elif kind == "c":
            out.append((spec + "c") % (chr(value) if isinstance(value, int) else value))
        elif kind == "s":
            out.append((spec + "s") % (value,))
        elif kind in "aA":
            out.append((spec + "s") % float(value).hex())
        else:
            out.append((spec + kind) % float(value))
    if values:
        raise ValueError(
            f"printf format {fmt!r} has fewer conversions than the {len(args)} arguments"
        )
    return "".join(out)
