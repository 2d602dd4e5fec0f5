"""What a client can make the daemon write in its log: nothing forged (its strings are
escaped), nothing unbounded (rejections are counted, not each logged), no traceback for a
message that does not parse; and what the log says when workers die or the daemon stops."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import time

import grpc
import pytest
from conftest import alive, children_of, round_trip, runtime_of, simnpu_segments

from simnpu.client import autostart
from simnpu.proto import bulk as wire
from simnpu.proto import codes, commands, messages, npu_pb2, service
from simnpu.proto.errors import NpuError

FORGED = "2024-01-01 00:00:00,000 simnpu ERROR forged by a client"


class RawSession:
    """A Session stream driven by hand, as a client not using our library could."""

    def __init__(self, address: str, process_name: str):
        self.channel = grpc.insecure_channel(address, options=service.CHANNEL_OPTIONS)
        self.outgoing: queue.Queue = queue.Queue()
        session = self.channel.stream_stream(
            service.SESSION_METHOD,
            request_serializer=lambda message: message,
            response_deserializer=wire.parse_server,
        )
        self.call = session(iter(self.outgoing.get, None))
        self.incoming = iter(self.call)
        hello = npu_pb2.HelloRequest(pid=os.getpid(), process_name=process_name)
        assert self.request(messages.request(1, 0, hello)).code == 0

    def send(self, *items: npu_pb2.Item) -> None:
        self.outgoing.put(npu_pb2.ClientMessage(items=items).SerializeToString())

    def request(self, request: npu_pb2.Request, *before: npu_pb2.Item) -> npu_pb2.Reply:
        """Send `before`, then `request`, in one message; its reply."""
        self.send(*before, npu_pb2.Item(request=request))
        return next(self.incoming).replies[0]

    def close(self) -> None:
        self.outgoing.put(None)
        self.call.cancel()
        self.channel.close()


def wait_for_line(daemon, pattern: str, timeout: float = 30) -> str:
    """The first line of `daemon`'s log matching `pattern`, waiting for it to be written."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in daemon.output().splitlines() if re.search(pattern, line)]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no line matching {pattern!r}:\n{daemon.output()}"
        time.sleep(0.05)


def test_a_process_name_cannot_forge_a_log_line(start_daemon):
    daemon = start_daemon("--log-level", "INFO")
    raw = RawSession(daemon.address, f"app\n{FORGED}\x1b[2J")
    bad_event = commands.RecordEvent.pack(1 << 40, 0)  # logged with the process name
    assert raw.request(messages.request(2, 0, npu_pb2.GetMemInfoRequest(device=0))).code == 0
    raw.send(npu_pb2.Item(commands=bad_event))
    raw.close()
    ended = wait_for_line(daemon, r"\) ended")
    assert "(pid %d app\\n%s\\x1b[2J)" % (os.getpid(), FORGED) in ended
    lines = daemon.output().splitlines()
    assert not [line for line in lines if line.startswith(FORGED)]
    assert "\x1b" not in daemon.output()


def test_rejected_calls_are_counted_not_each_logged(start_daemon):
    daemon = start_daemon("--log-level", "INFO")
    raw = RawSession(daemon.address, "rejected")
    bad_events = commands.RecordEvent.pack(1 << 40, 0) * 10_000
    sync = messages.request(2, 0, npu_pb2.GetMemInfoRequest(device=0))
    assert raw.request(sync, npu_pb2.Item(commands=bad_events)).code == 0
    raw.close()
    ended = wait_for_line(daemon, r"ended after")
    assert "10002 calls, 10000 rejected" in ended  # and HELLO and the sync
    lines = daemon.output().splitlines()
    assert len([line for line in lines if "rejected asynchronous call" in line]) == 10
    assert len(lines) < 30, daemon.output()


def test_a_message_that_does_not_parse_is_one_log_line(start_daemon):
    daemon = start_daemon()
    with grpc.insecure_channel(daemon.address) as channel:
        session = channel.stream_stream(
            service.SESSION_METHOD,
            request_serializer=lambda raw: raw,
            response_deserializer=wire.parse_server,
        )
        answer = list(session(iter([b"\xff\xff"]), timeout=30))  # ended, not left hanging
        notices = [notice for message in answer for notice in message.notices]
        assert [notice.kind for notice in notices] == [npu_pb2.Notice.KIND_DEVICE_GONE]
        assert "does not parse" in notices[0].message
        query = channel.unary_unary(
            service.QUERY_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as caught:
            query(b"\xff\xff\xff", timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    wait_for_line(daemon, r"a query from .* does not parse")
    log = daemon.output()
    assert "Traceback" not in log
    assert len([line for line in log.splitlines() if "does not parse" in line]) == 2, log


# ---- other clients' identity -----------------------------------------------------------------
def test_messages_about_other_clients_memory_name_them_in_the_log_only(start_daemon):
    daemon = start_daemon("--log-level", "INFO")
    holder, intruder = RawSession(daemon.address, "holder-app"), RawSession(daemon.address, "x")
    try:
        malloc = npu_pb2.MallocRequest(device=0, size=200 << 20, policy=0)
        held = holder.request(messages.request(2, 0, malloc))
        assert held.code == 0
        malloc = npu_pb2.MallocRequest(device=0, size=100 << 20, policy=0)
        oom = intruder.request(messages.request(2, 0, malloc))
        assert oom.code == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
        assert "by 1 other client(s)" in oom.message and "holder-app" not in oom.message
        free = npu_pb2.FreeRequest(address=held.malloc.address)
        refused = intruder.request(messages.request(3, 0, free))
        assert refused.code == codes.ACL_ERROR_RT_PARAM_INVALID
        assert "belongs to another client" in refused.message
        assert "holder-app" not in refused.message
    finally:
        holder.close()
        intruder.close()
    top = wait_for_line(daemon, "top users")
    assert "top users: session 1 (pid %d holder-app): " % os.getpid() in top
    tried = wait_for_line(daemon, "aclrtFree of")
    assert tried.endswith("an allocation of session 1 (pid %d holder-app)" % os.getpid())


# ---- kernel process deaths -----------------------------------------------------------------------
# Kernel modules whose kernel process ends as it loads them (on the module's first launch).
# The first closes its pipe to the daemon a moment before it exits, as a process busy ending
# does: its end must still be told by its exit code, not by the daemon's own kill.
ENDINGS = {
    "exited with code 7": (
        "import os, time\nos.closerange(3, 65536)\ntime.sleep(0.5)\nos._exit(7)\n"
    ),
    "was killed by signal 9 (SIGKILL)": "import os\nos.kill(os.getpid(), 9)\n",
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_kernel_process_death_is_reported_with_its_cause(daemon, ending):
    source = ENDINGS[ending] + "from simnpu import kernel\n@kernel()\ndef never(ctx):\n    pass\n"
    with runtime_of(daemon.address) as rt:
        never = rt.kernels.get_function(rt.kernels.binary_load(source, "ends.py"), "never")
        stream = rt.streams.create_stream()
        rt.kernels.launch_kernel(never, 1, b"", stream)
        with pytest.raises(NpuError) as caught:
            rt.sync.synchronize_stream(stream)
        assert caught.value.code == codes.ACL_ERROR_RT_AICORE_EXCEPTION
        assert re.search(
            rf"AI core [0-9]+ \(the kernel process of session [0-9]+ \(pid [0-9]+ [^)]*\)\) "
            f"{re.escape(ending)} while running never",
            str(caught.value),
        )
        logged = wait_for_line(daemon, re.escape(f"{ending} while running 1 task"))
        assert "the kernel process of session" in logged
        rt.streams.destroy_stream(stream)


def test_a_sigterm_to_the_daemons_process_group_logs_no_error(tmp_path):
    """`docker stop`, or Ctrl-C of `simnpu serve` in a terminal, signals the daemon and its
    workers alike: the workers leave stopping to the daemon, which stops them in order."""
    address = f"unix://{tmp_path}/npu.sock"
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "simnpu.server", "--listen", address, "--memory", "64MiB"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not autostart.reachable(address):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.02)
        workers = children_of(process.pid)
        with runtime_of(address) as rt:
            round_trip(rt)  # every worker has done some work
        os.killpg(process.pid, signal.SIGTERM)
        try:
            assert process.wait(30) == 0
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGUSR1)  # its threads' stacks, into the log
            time.sleep(1)
            pytest.fail(f"the daemon did not stop:\n{log_path.read_text()}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if alive(pid)]
    assert not [name for name in simnpu_segments() if name.startswith(f"simnpu-{process.pid}-")]
    output = log_path.read_text()
    assert " ERROR " not in output and "Traceback" not in output, output


def test_sigusr1_writes_every_threads_stack_to_the_log_and_changes_nothing_else(start_daemon):
    daemon = start_daemon()
    os.kill(daemon.pid, signal.SIGUSR1)
    wait_for_line(daemon, r"^Thread 0x[0-9a-f]+ \(most recent call first\):")
    wait_for_line(daemon, r"in wait")  # the main thread, waiting for a stop
    with runtime_of(daemon.address) as rt:
        round_trip(rt)  # it serves on
    assert daemon.process.poll() is None
