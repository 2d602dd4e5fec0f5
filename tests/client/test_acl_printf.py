"""Device printf through acl: what a program's kernels print (ctx.printf, print) reaches that
program's stdout when it synchronizes, in task order, after a DumpHead line per block; a
flood is cut and blocks nobody."""

from __future__ import annotations

import re

from conftest import round_trip, run_client, runtime_of, start_client

from simnpu.server.core.owner import PENDING_SPACE
from simnpu.server.core.unit_protocol import INCOMPLETE, MAX_OUTPUT, TASK_SPACE

PROGRAM = '''
import struct, sys
import acl

SOURCE = b"""
from simnpu import kernel

@kernel("u32")
def talk(ctx, tag):
    ctx.printf("tag %u block %d of %d\\\\n", tag, ctx.block_idx, ctx.block_num)
    print("print", tag, ctx.block_idx)

@kernel("u32")
def hello(ctx, unused):
    ctx.printf("Hello World\\\\n")

@kernel("u32")
def flood(ctx, lines):
    for _ in range(lines):
        print("x" * 99)

@kernel("u32")
def prints_then_fails(ctx, tag):
    ctx.printf("tag %d says goodbye\\\\n", tag)
    raise ValueError("boom")

@kernel("u32")
def odd_text(ctx, tag):
    print("lone \\ud800 surrogate")
    raise ValueError("lone \\ud800 surrogate")

@kernel("u32")
def bad_format(ctx, tag):
    ctx.printf("%d and %d\\\\n", tag)
"""


def check(ret, what):
    if ret != 0:
        print(f"{what} returned {ret}", file=sys.stderr)
        raise SystemExit(1)


check(acl.init(), "init")
check(acl.rt.set_device(0), "set_device")
binary, ret = acl.rt.binary_load_from_data(SOURCE, None)
check(ret, "binary_load_from_data")


def launch(name, blocks, value, stream):
    function, ret = acl.rt.binary_get_function(binary, name)
    check(ret, "binary_get_function")
    args = struct.pack("<I", value)
    return acl.rt.launch_kernel_with_host_args(
        function, blocks, stream, None, acl.util.bytes_to_ptr(args), len(args)
    )


def say(text):
    print(text, flush=True)
'''

END = """
acl.rt.reset_device(0)
check(acl.finalize(), "finalize")
"""

HEAD = re.compile(
    r"opType=(\w+), DumpHead: AIV-(\d+), CoreType=AIV, block dim=(\d+), total_block_num=\3, "
    rf"block_remain_len=(\d+), block_initial_space={TASK_SPACE}, rsv=(0|7), magic=5aa5bccd"
)


def run(daemon, body: str, env=None) -> str:
    done = run_client(daemon.address, PROGRAM + body + END, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def heads(text: str) -> list[tuple[str, int, int, int]]:
    """(kernel, block, block dim, rsv) of every DumpHead line of `text`; every line that
    starts like one is one."""
    found = []
    for line in text.splitlines():
        if line.startswith("opType="):
            match = HEAD.fullmatch(line)
            assert match, line
            found.append((match[1], int(match[2]), int(match[3]), int(match[5])))
    return found


def test_output_reaches_the_program_in_task_order_when_it_synchronizes(daemon):
    """aclrtSynchronizeStream(WithTimeout) prints what the stream's kernels printed, once,
    before it returns; nothing is printed before."""
    out = run(
        daemon,
        """
s1, ret = acl.rt.create_stream()
s2, ret = acl.rt.create_stream()
check(launch("talk", 3, 1, s1), "launch")
check(launch("talk", 1, 2, s1), "launch")
say("launched")
check(acl.rt.synchronize_stream(s1), "synchronize_stream")
say("synchronized")
check(acl.rt.synchronize_stream(s1), "synchronize_stream")
say("again")
check(launch("talk", 2, 3, s2), "launch")
check(acl.rt.synchronize_stream_with_timeout(s2, 60000), "synchronize_stream_with_timeout")
say("with timeout")
check(acl.rt.destroy_stream(s1), "destroy_stream")
check(acl.rt.destroy_stream(s2), "destroy_stream")
""",
    )
    text = [line for line in out.splitlines() if not line.startswith("opType=")]
    assert text == [
        "launched",
        "tag 1 block 0 of 3",
        "print 1 0",
        "tag 1 block 1 of 3",
        "print 1 1",
        "tag 1 block 2 of 3",
        "print 1 2",
        "tag 2 block 0 of 1",
        "print 2 0",
        "synchronized",
        "again",
        "tag 3 block 0 of 2",
        "print 3 0",
        "tag 3 block 1 of 2",
        "print 3 1",
        "with timeout",
    ]
    assert heads(out) == [
        ("talk", 0, 3, 0),
        ("talk", 1, 3, 0),
        ("talk", 2, 3, 0),
        ("talk", 0, 1, 0),
        ("talk", 0, 2, 0),
        ("talk", 1, 2, 0),
    ]
    lines = out.splitlines()
    for index, line in enumerate(lines):  # each DumpHead comes right before its block's text
        if line.startswith("opType="):
            block = HEAD.fullmatch(line)[2]  # type: ignore[index]
            assert re.fullmatch(rf"tag \d block {block} of \d", lines[index + 1])


def test_the_runtime_print_sample(daemon):
    """CANN's example/kernel_func/kernel_print.cpp: AscendC::printf("Hello World\\n") on 8
    blocks, then aclrtSynchronizeStream."""
    out = run(
        daemon,
        """
stream, ret = acl.rt.create_stream()
check(launch("hello", 8, 0, stream), "launch")
check(acl.rt.synchronize_stream(stream), "synchronize_stream")
check(acl.rt.destroy_stream(stream), "destroy_stream")
""",
    )
    assert heads(out) == [("hello", block, 8, 0) for block in range(8)]
    assert [line for line in out.splitlines() if not line.startswith("opType=")] == [
        "Hello World"
    ] * 8


def test_checked_and_traced_launches_print_the_same(daemon, tmp_path):
    """Under SIMNPU_CHECK and SIMNPU_TRACE (every synchronize asks the daemon; checked
    kernels run in a recording context) the output is the same."""
    body = """
stream, ret = acl.rt.create_stream()
check(launch("talk", 2, 4, stream), "launch")
check(acl.rt.synchronize_stream(stream), "synchronize_stream")
say("synchronized")
check(acl.rt.destroy_stream(stream), "destroy_stream")
"""
    expected = ["tag 4 block 0 of 2", "print 4 0", "tag 4 block 1 of 2", "print 4 1"]
    for env in (
        {"SIMNPU_CHECK": "memcheck", "SIMNPU_CHECK_REPORT": str(tmp_path / "check.txt")},
        {"SIMNPU_TRACE": str(tmp_path / "trace.json")},
    ):
        out = run(daemon, body, env)
        text = [line for line in out.splitlines() if not line.startswith("opType=")]
        assert text == [*expected, "synchronized"], env
        assert heads(out) == [("talk", 0, 2, 0), ("talk", 1, 2, 0)]


def test_a_failed_synchronize_and_the_device_synchronize_print_too(daemon):
    """A kernel's output before it failed comes with the synchronize that reports the
    failure; aclrtSynchronizeDevice prints every stream's output; a format whose arguments do
    not match fails the launch like any exception of a kernel; text that is not Unicode (a
    lone surrogate) in the output or the failure's message comes with "?" in its place."""
    out = run(
        daemon,
        """
stream, ret = acl.rt.create_stream()
check(launch("prints_then_fails", 1, 7, stream), "launch")
say(f"failed with {acl.rt.synchronize_stream(stream)}")
check(launch("talk", 1, 8, stream), "launch")
check(launch("talk", 1, 9, 0), "launch")
check(acl.rt.synchronize_device(), "synchronize_device")
say("device synchronized")
check(launch("bad_format", 1, 1, stream), "launch")
say(f"bad format: {acl.rt.synchronize_stream(stream)}")
say("needs more arguments" in acl.get_recent_err_msg())
check(launch("odd_text", 1, 0, stream), "launch")
say(f"odd text: {acl.rt.synchronize_stream(stream)}")
check(launch("talk", 1, 10, stream), "launch")
check(acl.rt.synchronize_stream(stream), "synchronize_stream")
check(acl.rt.destroy_stream(stream), "destroy_stream")
""",
    )
    text = [line for line in out.splitlines() if not line.startswith("opType=")]
    assert text == [
        "tag 7 says goodbye",
        "failed with 507015",
        "tag 8 block 0 of 1",
        "print 8 0",
        "tag 9 block 0 of 1",
        "print 9 0",
        "device synchronized",
        "bad format: 507015",
        "True",
        "lone ? surrogate",
        "odd text: 507015",
        "tag 10 block 0 of 1",
        "print 10 0",
    ]
    assert [head[0] for head in heads(out)] == [
        "prints_then_fails",
        "talk",
        "talk",
        "odd_text",
        "talk",
    ]


def test_a_flood_is_cut_and_says_so(daemon):
    """A launch prints at most its space (rsv=7 and the runtime's "incomplete" line mark
    the cut); what waits for a synchronize is bounded too."""
    out = run(
        daemon,
        """
stream, ret = acl.rt.create_stream()
check(launch("flood", 4, 2000, stream), "launch")
check(acl.rt.synchronize_stream(stream), "synchronize_stream")
say("one launch")
for _ in range(PENDING_SPACE // TASK_SPACE + 4):
    check(launch("flood", 1, 2000, stream), "launch")
check(acl.rt.synchronize_stream(stream), "synchronize_stream")
say("many launches")
check(acl.rt.destroy_stream(stream), "destroy_stream")
""".replace("PENDING_SPACE", str(PENDING_SPACE)).replace("TASK_SPACE", str(TASK_SPACE)),
    )
    one, many = out.split("one launch\n")
    assert INCOMPLETE in one
    assert any(rsv == 7 for *_, rsv in heads(one))
    assert len(one) <= MAX_OUTPUT + len(INCOMPLETE) + 1  # whatever its pieces
    assert many.endswith("many launches\n") and len(many) <= PENDING_SPACE + 4096
    assert heads(many) and all(rsv == 7 for *_, rsv in heads(many))


def test_a_flood_blocks_no_other_client(daemon):
    """A program that floods the device printf while never synchronizing holds up neither
    the daemon nor another client, and its output stays bounded."""
    flooder = start_client(
        daemon.address,
        PROGRAM
        + """
stream, ret = acl.rt.create_stream()
for _ in range(60):
    check(launch("flood", 2, 5000, stream), "launch")
say("flooding")
check(acl.rt.synchronize_stream(stream), "synchronize_stream")
say("done")
"""
        + END,
    )
    try:
        with runtime_of(daemon.address) as rt:
            for _ in range(5):
                round_trip(rt)
        out, err = flooder.communicate(timeout=300)
    finally:
        if flooder.poll() is None:
            flooder.kill()
            flooder.wait()
    assert flooder.returncode == 0, err
    assert out.startswith("flooding\n") and out.endswith("done\n")
    assert len(out) <= PENDING_SPACE + 4096
    with runtime_of(daemon.address) as rt:  # the daemon is as it was
        round_trip(rt)
