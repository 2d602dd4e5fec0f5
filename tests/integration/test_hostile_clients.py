"""One client cannot starve or lock out the others: a launch's block count is bounded, the
work of a client that died stops taking AI-core time, kernel modules are parsed out of the
daemon's way and within bounds, and no client can take every stream or event of a device.

Each test runs its own daemon (`start_daemon`), whose stop checks that its log holds no
traceback and that nothing outlived it. No test asserts on how long anything takes: a
synchronize with a generous timeout either succeeds or proves the device was held.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading

import pytest
from conftest import runtime_of, start_client

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
        rt.sync.synchronize_stream(0)
    except NpuError as error:
        return error.code
    return codes.ACL_SUCCESS


def _runs(rt, stream: int, blocks: int) -> None:
    """Launch the built-in empty kernel on `blocks` blocks and synchronize within
    GENEROUS_MS (507046 if the AI cores stay taken)."""
    empty = rt.kernels.get_function(commands.BUILTIN_BINARY, "empty")
    rt.kernels.launch_kernel(empty, blocks, b"", stream)
    rt.sync.synchronize_stream(stream, GENEROUS_MS)


# ---- numBlocks ----------------------------------------------------------------------------------
def test_num_blocks_beyond_the_16_bit_block_dim(start_daemon):
    daemon = start_daemon()
    with runtime_of(daemon.address) as rt:
        empty = rt.kernels.get_function(commands.BUILTIN_BINARY, "empty")
        for blocks in (codes.MAX_NUM_BLOCKS + 1, 1 << 28, (1 << 32) - 1):
            before = rt.connection.log.seq
            with pytest.raises(NpuError) as caught:
                rt.kernels.launch_kernel(empty, blocks, b"", 0)
            assert caught.value.code == PARAM
            assert f"numBlocks {blocks}" in caught.value.message
            assert str(codes.MAX_NUM_BLOCKS) in caught.value.message
            assert rt.connection.log.seq == before, "refused by the client, nothing sent"
            # straight at the daemon, the client's check skipped
            assert _deferred_code(
                rt, commands.Launch.pack(blocks, rt.contexts.stream(0), empty, b"")
            ) == (PARAM)
        ptr = rt.memory.malloc(64)
        assert (
            _deferred_code(
                rt,
                commands.LaunchDeviceArgs.pack(1 << 20, rt.contexts.stream(0), empty, ptr, 0),
            )
            == PARAM
        )
        rt.memory.free(ptr)
        _runs(rt, 0, codes.MAX_NUM_BLOCKS)  # the limit itself is a launch like any other


# ---- the work of a client that is gone ---------------------------------------------------------
HOG = f"""
import os, time
from simnpu.client.runtime import Runtime
from simnpu.proto import codes

rt = Runtime(os.environ["SIMNPU_ADDRESS"])
rt.contexts.set_device(0)
nap = rt.kernels.get_function(rt.kernels.binary_load({NAP!r}), "nap")
stream = rt.streams.create_stream()
rt.kernels.launch_kernel(nap, {{blocks}}, rt.kernels.signature(nap).pack({{seconds}}), stream)
# a round trip after the launch: the daemon has handed its blocks to the AI cores
assert rt.sync.stream_query(stream) == codes.ACL_STREAM_STATUS_NOT_READY
print("running", flush=True)
time.sleep(600)
"""


def test_the_blocks_of_a_killed_client_stop_taking_the_ai_cores(start_daemon):
    """A client launches 65,535 blocks of 20 ms on both AI cores (over 10 minutes of work)
    and is SIGKILLed: its cores skip the blocks they have not started, the blocks not
    handed out are dropped, and a bystander's kernel runs."""
    daemon = start_daemon("--ai-cores", "2")
    hog = start_client(daemon.address, HOG.format(blocks=codes.MAX_NUM_BLOCKS, seconds=0.02))
    try:
        assert hog.stdout.readline() == "running\n", hog.communicate()
    finally:
        hog.kill()
        hog.communicate()
    with runtime_of(daemon.address) as rt:
        stream = rt.streams.create_stream()
        _runs(rt, stream, 2)
        _runs(rt, stream, 64)
        rt.streams.destroy_stream(stream)


def test_force_destroying_a_stream_whose_launch_is_handed_out_in_part(start_daemon):
    """aclrtDestroyStreamForce drops queued tasks, not the rest of a launch already running:
    its blocks not yet handed out still run, and the destroy returns."""
    daemon = start_daemon("--ai-cores", "2")
    with runtime_of(daemon.address) as rt:
        nap = rt.kernels.get_function(rt.kernels.binary_load(NAP), "nap")
        stream = rt.streams.create_stream()
        # 4 blocks on 2 cores: blocks 0-1 on one, 2 on the other, 3 waits for a free core
        rt.kernels.launch_kernel(nap, 4, rt.kernels.signature(nap).pack(2.0), stream)
        rt.kernels.launch_kernel(
            nap, 1, rt.kernels.signature(nap).pack(0.0), stream
        )  # queued: dropped
        assert rt.sync.stream_query(stream) == codes.ACL_STREAM_STATUS_NOT_READY
        done = threading.Event()
        destroy = threading.Thread(
            target=lambda: (rt.streams.destroy_stream(stream, force=True), done.set()), daemon=True
        )
        destroy.start()
        destroy.join(GENEROUS_MS / 1000)
        assert done.is_set(), "the destroy never returned: the launch's last block never ran"
        _runs(rt, 0, 2)


# ---- kernel modules ------------------------------------------------------------------------------
def _module(size: int) -> str:
    """A kernel module of about `size` bytes (at most), of many small kernels."""
    parts = ["from simnpu import kernel\n"]
    total = len(parts[0])
    index = 0
    while True:
        part = (
            f'\n@kernel("ptr", "u32")\ndef k{index}(ctx, x, n):\n'
            f'    v = ctx.gm(x, "float32", n)\n    v[:] = v * 2.0 + {index} - (v + 1) * 3\n'
        )
        if total + len(part) > size:
            return "".join(parts)
        parts.append(part)
        total += len(part)
        index += 1


LOADER = """
import os, sys
from simnpu.client.runtime import Runtime
from simnpu.proto.errors import NpuError

rt = Runtime(os.environ["SIMNPU_ADDRESS"])
rt.contexts.set_device(0)
with open(sys.argv[1], encoding="utf-8") as module:
    source = module.read()
print("loading", flush=True)
try:
    rt.kernels.binary_load(source, "big.py")
except NpuError as error:
    print("refused", error.code, flush=True)
"""
ROUND_TRIPS = 50


def test_other_clients_go_on_while_a_big_module_is_parsed(start_daemon, tmp_path):
    """A client loads a module just under the default 1 MiB limit whose last line does not
    parse: seconds of CPU in C code that holds the GIL, which in the daemon's own process
    held every thread (no other client could make a call) until the parse ended. Now a
    bystander completes its round trips while that load is still in progress."""
    daemon = start_daemon()
    source = _module((1 << 20) - 64)
    path = tmp_path / "big.py"
    path.write_text(source + "def broken(:\n", encoding="utf-8")
    loader = subprocess.Popen(
        [sys.executable, "-c", LOADER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SIMNPU_ADDRESS": daemon.address},
    )
    try:
        assert loader.stdout.readline() == "loading\n", loader.communicate()
        with runtime_of(daemon.address) as rt:
            for _ in range(ROUND_TRIPS):
                _runs(rt, 0, 2)
            answered, _, _ = select.select([loader.stdout], [], [], 0)
            assert not answered, f"the load ended before the bystander's {ROUND_TRIPS} round trips"
            out, err = loader.communicate(timeout=GENEROUS_MS / 1000)
            assert out == f"refused {codes.ACL_ERROR_INVALID_FILE}\n", err
            rt.kernels.get_function(
                rt.kernels.binary_load(source, "big.py"), "k0"
            )  # under the limit: loads
    finally:
        loader.kill()
        loader.communicate()


def test_a_module_over_the_size_limit_is_an_invalid_file(start_daemon):
    daemon = start_daemon("--max-module-size", "64KiB")
    with runtime_of(daemon.address) as rt:
        source = _module(64 << 10)
        source += "#" * ((64 << 10) - len(source))
        rt.kernels.get_function(rt.kernels.binary_load(source), "k0")  # the limit itself loads
        with pytest.raises(NpuError) as caught:
            rt.kernels.binary_load(source + "#", "over.py")
        assert caught.value.code == codes.ACL_ERROR_INVALID_FILE
        assert "over.py" in caught.value.message
        assert "65,537 bytes" in caught.value.message and "65,536" in caught.value.message
        assert "--max-module-size" in caught.value.message
        rt.kernels.get_function(rt.kernels.binary_load(NAP, "odd name\n.py"), "nap")
        with pytest.raises(NpuError) as caught:
            rt.kernels.binary_load(NAP, "nul\0.py")  # compile() takes no such name
        assert caught.value.code == codes.ACL_ERROR_INVALID_FILE
        _runs(rt, 0, 2)


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("x = " + "-" * 100_000 + "1\n", "MemoryError"),  # the parser's own stack
        ("x = 1" + "+1" * 300_000 + "\n", "RecursionError"),  # building the syntax tree
        ("x = " + "(" * 1000 + ")" * 1000 + "\n", "too many nested parentheses"),
    ],
    ids=["unary-chain", "binary-chain", "parentheses"],
)
def test_modules_nested_too_deeply_to_parse_are_invalid_files(start_daemon, source, why):
    daemon = start_daemon()
    with runtime_of(daemon.address) as rt:
        with pytest.raises(NpuError) as caught:
            rt.kernels.binary_load(source, "deep.py")
        assert caught.value.code == codes.ACL_ERROR_INVALID_FILE, caught.value
        assert "deep.py" in caught.value.message and why in caught.value.message
        _runs(rt, 0, 2)


# ---- streams and events ------------------------------------------------------------------------
NO_STREAM = codes.ACL_ERROR_RT_NO_STREAM_RESOURCE
NO_EVENT = codes.ACL_ERROR_RT_NO_EVENT_RESOURCE


def test_one_client_cannot_take_every_stream_of_the_device(start_daemon):
    """By default a client may have 1024 of the device's 1984 streams (its contexts' default
    streams count too): past them it gets 207008 saying so, and another client still
    creates streams."""
    daemon = start_daemon()
    with runtime_of(daemon.address) as hog, runtime_of(daemon.address) as other:
        streams = []
        with pytest.raises(NpuError) as caught:
            while len(streams) < codes.MAX_STREAMS_PER_DEVICE:
                streams.append(hog.streams.create_stream())
        assert caught.value.code == NO_STREAM
        assert "this client has 1024 streams on device 0" in caught.value.message
        assert "--max-streams-per-client" in caught.value.message
        assert len(streams) == 1023  # and the default stream of its context
        stream = other.streams.create_stream()
        _runs(other, stream, 2)
        other.streams.destroy_stream(stream)
        hog.streams.destroy_stream(streams.pop())
        streams.append(hog.streams.create_stream())  # one destroyed, one more may be made
        with pytest.raises(NpuError) as caught:
            hog.streams.create_stream()
        assert caught.value.code == NO_STREAM


def test_the_stream_and_event_limits_per_client_are_flags(start_daemon):
    daemon = start_daemon("--max-streams-per-client", "3", "--max-events-per-client", "16")
    with runtime_of(daemon.address) as hog, runtime_of(daemon.address) as other:
        streams = [hog.streams.create_stream(), hog.streams.create_stream()]
        with pytest.raises(NpuError) as caught:
            hog.streams.create_stream()
        assert caught.value.code == NO_STREAM and "has 3 streams" in caught.value.message
        events = [hog.events.create_event() for _ in range(16)]
        with pytest.raises(NpuError) as caught:
            hog.events.create_event()
        assert caught.value.code == NO_EVENT
        assert "this client has 16 events on device 0" in caught.value.message
        assert "--max-events-per-client" in caught.value.message
        other_events = [other.events.create_event() for _ in range(16)]  # the other client's own 16
        other.events.record_event(other_events[0], 0)
        other.sync.synchronize_event(other_events[0])
        hog.events.destroy_event(events.pop())
        events.append(hog.events.create_event())
        # the events of a destroyed context are no longer the client's
        hog.streams.destroy_stream(streams.pop())
        context = hog.contexts.create_context(0)
        for event in events:
            hog.events.destroy_event(event)
        events = [hog.events.create_event() for _ in range(16)]
        hog.contexts.destroy_context(context)
        hog.contexts.set_device(0)
        events = [hog.events.create_event() for _ in range(16)]
        _runs(hog, streams[0], 2)
