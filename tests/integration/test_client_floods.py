"""Clients that flood the daemon's log or its module parser (docs/client-bounds.md): each
case lets a client do so against a real daemon and checks what the daemon keeps and logs,
and that another client's small module load is served in its turn."""

from __future__ import annotations

import re
import statistics
import time

from conftest import run_client, start_client

from simnpu.client.tools.query import query
from simnpu.server.core.rate_limits import LOG_BURST, LOG_RATE
from simnpu.server.core.untrusted import PROCESS_NAME

HUGE_NAME = """
import sys
from simnpu.client.runtime import Runtime

sys.argv[0] = "n" * (16 << 20)  # the hello's process name
for _ in range(3):
    Runtime().close()
rt = Runtime()
print("open", flush=True)
sys.stdin.readline()
rt.close()
"""


def test_a_huge_process_name_is_cut_and_does_not_flood_the_log(start_daemon):
    """A client whose hello names a process of 16 MiB, in four sessions: smi shows the name
    cut, and the daemon's log grows by far less than one copy of it."""
    daemon = start_daemon("--log-level", "INFO")
    before = len(daemon.output())
    client = start_client(daemon.address, HUGE_NAME, stdin=True)
    try:
        assert client.stdout.readline().strip() == "open", client.stderr.read()
        names = [p["name"] for p in query("devices", 0, daemon.address)["processes"]]
        assert len(names) == 1 and len(names[0]) == PROCESS_NAME, [len(n) for n in names]
        assert names[0] == "n" * (PROCESS_NAME - 1) + "\u2026"
    finally:
        client.communicate("\n", timeout=60)
    assert client.returncode == 0, client.stderr
    deadline = time.monotonic() + 30
    while daemon.output().count("ended after") < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert daemon.output().count("ended after") == 4
    assert len(daemon.output()) - before < 64 << 10


MANY_SESSIONS = """
import os
import time
from simnpu.client.runtime import Runtime

print(os.getpid(), flush=True)
start = time.monotonic()
for _ in range(SESSIONS):
    Runtime().close()
time.sleep(1.5)  # its rate gives it a line again, which says how many were not logged
Runtime().close()
print(time.monotonic() - start, flush=True)
"""


def test_a_client_that_provokes_many_log_lines_is_rate_limited(start_daemon):
    """One process opens and closes 100 sessions and then one more (each end is a log
    line): the daemon logs its burst and then its rate, and a later line says how many it
    did not log."""
    daemon = start_daemon("--log-level", "INFO")
    sessions = 100
    done = run_client(daemon.address, MANY_SESSIONS.replace("SESSIONS", str(sessions)), timeout=300)
    assert done.returncode == 0, done.stderr
    pid, elapsed = done.stdout.split()
    deadline = time.monotonic() + 30
    while True:
        log = daemon.output()
        ends = re.findall(rf"\(pid {pid} -c\) ended after", log)
        dropped = [int(n) for n in re.findall(rf"pid {pid}: (\d+) log lines? about it not", log)]
        if len(ends) + sum(dropped) == sessions + 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(ends) + sum(dropped) == sessions + 1, log[-3000:]  # each logged or counted
    assert dropped and len(ends) <= LOG_BURST + LOG_RATE * float(elapsed) + 1, (ends, elapsed)


TOO_LONG = """
import simnpu.client as npu
from simnpu.client.runtime import Runtime
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError

SOURCE = 'from simnpu import kernel\\n\\n@kernel("ptr")\\ndef k(ctx, p):\\n    pass\\n'

def code(call):
    try:
        call()
    except NpuError as error:
        return f"{error.code}:{len(error.message)}"
    return "0:0"

rt = Runtime()
rt.contexts.set_device(0)
binary = rt.kernels.binary_load(SOURCE, "m.py")
huge = "x" * (16 << 20)
print(code(lambda: rt.kernels.binary_load(SOURCE, huge)))
print(code(lambda: rt.kernels.get_function(binary, huge)))
print(code(lambda: rt.connection.call(pb.IpcMemImportRequest(key=huge, flags=0))))
print(code(lambda: rt.connection.call(pb.NotifyImportRequest(key=huge, flags=0))))
print(code(lambda: rt.kernels.get_function(binary, "k")))
rt.close()
"""


def test_over_long_strings_are_refused_with_acl_error_invalid_param(daemon):
    """A module's file name, a kernel's name and IPC keys of 16 MiB are refused with 100000
    and a short message; the session goes on."""
    done = run_client(daemon.address, TOO_LONG, timeout=120)
    assert done.returncode == 0, done.stderr
    answers = [tuple(map(int, line.split(":"))) for line in done.stdout.split()]
    assert [code for code, _ in answers] == [100000] * 4 + [0], answers
    assert all(length < 400 for _, length in answers[:4]), answers  # only its start quoted


FLOODER = """
import time
import simnpu.client as npu

head = 'from simnpu import kernel\\n\\n@kernel("ptr")\\ndef flood(ctx, p):\\n    pass\\n\\n'
lines, size, i = [], len(head), 0
while True:
    line = f"def helper_{i}(a, b):\\n    return a * {i} + b - {i}\\n\\n"
    if size + len(line) > (1 << 20) - 64:
        break
    lines.append(line)
    size += len(line)
    i += 1
SOURCE = head + "".join(lines)
with npu.Device(0):
    print("ready", flush=True)
    while True:
        npu.Module.from_source(SOURCE, "flood.py")
        print(time.monotonic(), flush=True)
"""

VICTIM = """
import time
import simnpu.client as npu

SOURCE = 'from simnpu import kernel\\n\\n@kernel("ptr")\\ndef tiny(ctx, p):\\n    pass\\n'
with npu.Device(0):
    for _ in range(LOADS):
        time.sleep(0.5)
        asked = time.monotonic()
        npu.Module.from_source(SOURCE, "tiny.py").function("tiny")
        print(asked, time.monotonic(), flush=True)
"""


def test_a_small_load_is_not_served_after_the_floods_queued_loads(start_daemon):
    """Four processes load 1 MiB modules in a loop while a fifth loads a tiny one now and
    then: each of its loads completes, and while it waited hardly any flood load ended --
    it was served in its turn, not after the loads queued before it (on one clock, the
    system's monotonic one; counted, never timed)."""
    daemon = start_daemon()
    flooders = [start_client(daemon.address, FLOODER) for _ in range(4)]
    try:
        for flooder in flooders:
            assert flooder.stdout.readline().strip() == "ready", flooder.stderr.read()
        for flooder in flooders:  # every flooder had a load served: the flood is in full swing
            float(flooder.stdout.readline())
        loads = 6
        victim = run_client(daemon.address, VICTIM.replace("LOADS", str(loads)), timeout=600)
        assert victim.returncode == 0, victim.stderr
    finally:
        for flooder in flooders:
            flooder.kill()
    ended: list[float] = []  # when each flood load completed
    for flooder in flooders:
        out, _ = flooder.communicate(timeout=60)
        ended += [float(line) for line in out.split()]
    windows = [tuple(map(float, line.split())) for line in victim.stdout.splitlines()]
    assert len(windows) == loads
    during = [sum(asked < t < done for t in ended) for asked, done in windows]
    # served in its turn: at most the parses already running end meanwhile, and mostly none;
    # behind the queue, each load saw the running parses and the queued ones end first
    assert max(during) <= 2 and statistics.mean(during) <= 1, during
