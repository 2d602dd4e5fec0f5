"""One client cannot starve or lock out the others: a launch's block count is bounded, the
work of a client that died stops taking AI-core time, kernel modules are parsed out of the
daemon's way and within bounds, and no client can take every stream or event of a device.

Each test runs its own daemon (`start_daemon`), whose stop checks that its log holds no
traceback and that nothing outlived it. No test asserts on how long anything takes: a
synchronize with a generous timeout either succeeds or proves the device was held.
"""

from __future__ import annotations

import pytest
from conftest import runtime_of

from simnpu.proto import codes, commands
from simnpu.proto.errors import NpuError

PARAM = codes.ACL_ERROR_RT_PARAM_INVALID
GENEROUS_MS = 60_000  # what a synchronize may wait for work that takes well under a second

# A kernel whose every block sleeps `seconds`: a launch of many blocks holds the AI cores.
NAP = """
import time
from simnpu import kernel


@kernel("f64")
def nap(ctx, seconds):
    time.sleep(seconds)
"""


def _deferred_code(rt, record: bytes) -> int:
    """Send a command record as is, skipping the client's checks; the code the next
    synchronize of the default stream reports."""
    rt.connection.send_command(record, "test")
    try:
        rt.synchronize_stream(0)
    except NpuError as error:
        return error.code
    return codes.ACL_SUCCESS


def _runs(rt, stream: int, blocks: int) -> None:
    """Launch the built-in empty kernel on `blocks` blocks and synchronize within
    GENEROUS_MS (507046 if the AI cores stay taken)."""
    empty = rt.get_function(commands.BUILTIN_BINARY, "empty")
    rt.launch_kernel(empty, blocks, b"", stream)
    rt.synchronize_stream(stream, GENEROUS_MS)


# ---- numBlocks ----------------------------------------------------------------------------------
def test_num_blocks_beyond_the_16_bit_block_dim(start_daemon):
    daemon = start_daemon()
    with runtime_of(daemon.address) as rt:
        empty = rt.get_function(commands.BUILTIN_BINARY, "empty")
        for blocks in (codes.MAX_NUM_BLOCKS + 1, 1 << 28, (1 << 32) - 1):
            before = rt.connection.log.seq
            with pytest.raises(NpuError) as caught:
                rt.launch_kernel(empty, blocks, b"", 0)
            assert caught.value.code == PARAM
            assert f"numBlocks {blocks}" in caught.value.message
            assert str(codes.MAX_NUM_BLOCKS) in caught.value.message
            assert rt.connection.log.seq == before, "refused by the client, nothing sent"
            # straight at the daemon, the client's check skipped
            assert _deferred_code(rt, commands.Launch.pack(blocks, rt.stream(0), empty, b"")) == (
                PARAM
            )
        ptr = rt.malloc(64)
        assert (
            _deferred_code(
                rt,
                commands.LaunchDeviceArgs.pack(1 << 20, rt.stream(0), empty, ptr, 0),
            )
            == PARAM
        )
        rt.free(ptr)
        _runs(rt, 0, codes.MAX_NUM_BLOCKS)  # the limit itself is a launch like any other
