"""Device printf on the unit's side: C formats, a launch's output per block with its DumpHead,
the bounds, and the daemon's pending output of a client."""

from __future__ import annotations

import pytest

from simnpu.server.core.owner import PENDING_SPACE, PendingOutput
from simnpu.server.core.unit_protocol import (
    INCOMPLETE,
    MAX_OUTPUT,
    TASK_SPACE,
    LoadModule,
    RunKernel,
)
from simnpu.server.units.device_printf import c_format
from simnpu.server.units.runner import WorkRunner


@pytest.mark.parametrize(
    ("fmt", "args", "text"),
    [
        ("%d %i %u|%5d|%-4d|%05d", (1, -2, 3, 4, 5, 6), "1 -2 3|    4|5   |00006"),
        ("%ld %lld %lu %hd %zu", (1, 2, 3, 4, 5), "1 2 3 4 5"),
        ("%x %X %#x %o", (255, 255, 255, 8), "ff FF 0xff 10"),
        (
            "%f %.2f %8.3f %e %g",
            (1.5, 2.345, 3.0, 1000.0, 0.5),
            "1.500000 2.35    3.000 1.000000e+03 0.5",
        ),
        ("%s|%c|%c|%%|%p", ("ab", 65, "z", 4096), "ab|A|z|%|0x1000"),
        ("%*d|%.*f", (4, 7, 1, 2.25), "   7|2.2"),
        ("no conversions\n", (), "no conversions\n"),
    ],
)
def test_c_formats(fmt, args, text):
    assert c_format(fmt, args) == text


def test_arguments_that_do_not_match_the_format_raise():
    with pytest.raises(ValueError, match="needs more arguments"):
        c_format("%d %d", (1,))
    with pytest.raises(ValueError, match="fewer conversions"):
        c_format("%d", (1, 2))
    with pytest.raises(TypeError):
        c_format(b"%d", (1,))  # type: ignore[arg-type]


MODULE = """
from simnpu import kernel

@kernel("u32")
def talk(ctx, n):
    ctx.printf("block %d of %d\\n", ctx.block_idx, ctx.block_num)
    if ctx.block_idx == 1:
        print("and", n, "more", sep="-")

@kernel("u32")
def flood(ctx, n):
    for i in range(n):
        print("x" * 99)

@kernel("u32")
def silent(ctx, n):
    pass

@kernel("u32")
def prints_then_fails(ctx, n):
    ctx.printf("about to fail\\n")
    raise ValueError("boom")
"""


def run(name: str, first: int, last: int, blocks: int, n: int = 0) -> tuple:
    """One RunKernel of MODULE's `name` on a trusted unit's runner (built-in kernels' path)."""
    runner = WorkRunner(0, [bytearray(4096)], ["seg"], lambda report: None)
    runner.run([LoadModule.pack(1, MODULE, "<test>")], set)
    (result,) = runner.run([RunKernel.pack(7, 1, name, (n,), first, last, blocks, (), False)], set)
    return result


def head(block: int, blocks: int, remain: int, rsv: int = 0, name: str = "talk") -> str:
    return (
        f"opType={name}, DumpHead: AIV-{block}, CoreType=AIV, block dim={blocks}, "
        f"total_block_num={blocks}, block_remain_len={remain}, "
        f"block_initial_space={TASK_SPACE}, rsv={rsv}, magic=5aa5bccd\n"
    )


def test_each_block_that_prints_gets_a_dump_head_then_its_text():
    result = run("talk", 0, 3, 3, 5)
    assert result.code == 0 and result.message == ""
    parts = result.output.split("opType=")[1:]
    assert [part.split("\n", 1)[1] for part in parts] == [
        "block 0 of 3\n",
        "block 1 of 3\nand-5-more\n",
        "block 2 of 3\n",
    ]
    left = TASK_SPACE - len("block 0 of 3\n")
    assert result.output.startswith(head(0, 3, left))
    assert run("silent", 0, 3, 3).output == ""
    assert run("talk", 2, 3, 3).output.startswith(head(2, 3, TASK_SPACE - 13))


def test_output_of_a_failing_block_is_kept():
    result = run("prints_then_fails", 0, 2, 2)
    assert result.code == 507015 and "boom" in result.message
    assert result.output.endswith("about to fail\n") and result.output.count("opType=") == 1


def test_a_flood_is_cut_at_the_space_and_says_so():
    result = run("flood", 0, 3, 3, 5000)  # 500 kB per block
    assert len(result.output) <= TASK_SPACE + 2 * len(head(0, 3, 0, 7, "flood") + INCOMPLETE)
    assert result.output.startswith(INCOMPLETE + head(0, 3, 0, 7, "flood"))
    assert result.output.count(INCOMPLETE) == 1  # the blocks after it print nothing more


def test_pending_output_comes_in_task_then_block_order_and_is_bounded():
    pending = PendingOutput()
    assert not pending.pending and pending.take() == ""
    pending.add(5, 12, "task 5 second piece\n")
    pending.add(3, 20, "task 3\n")
    pending.add(5, 11, "task 5 first piece\n")
    pending.add(6, 30, "bad \ud800 text\n")
    assert pending.pending
    assert pending.take() == "task 3\ntask 5 first piece\ntask 5 second piece\nbad ? text\n"
    assert not pending.pending
    pending.add(1, 1, "a" * TASK_SPACE)
    pending.add(1, 2, "b" * TASK_SPACE)  # a launch's pieces keep MAX_OUTPUT together
    pending.add(1, 3, "c" * 10)
    cut = "a" * TASK_SPACE + "b" * (MAX_OUTPUT - TASK_SPACE) + "\n" + INCOMPLETE
    assert pending.take() == cut
    for seq in range(PENDING_SPACE // TASK_SPACE + 3):
        pending.add(seq, seq, "y" * TASK_SPACE)
    text = pending.take()
    assert text.startswith("y" * PENDING_SPACE + "[simnpu]")
    assert text.endswith(
        f"{3 * TASK_SPACE} characters of device output were dropped: "
        f"more than {PENDING_SPACE} waited for a synchronize\n"
    )
