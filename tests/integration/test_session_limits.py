"""One client cannot lock the others out: a session that never says hello is ended after
--hello-timeout, and one peer (a process, a remote host) holds at most
--max-sessions-per-peer sessions."""

from __future__ import annotations

import collections
import socket
import threading
import time

import grpc
import pytest
from conftest import round_trip, run_client

from simnpu.client.runtime import Runtime
from simnpu.client.tools.query import query
from simnpu.proto import bulk, codes, service
from simnpu.proto.errors import NpuError

TOKEN = "session-limits-test-token"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "07": "CLOSE", "0A": "LISTEN"}


def sockets_on(port: int) -> list[str]:
    """This host's TCP sockets whose local port is `port`, from /proc/net/tcp{,6}: what
    held the daemon's port when the test fails."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                if int(local.rsplit(":", 1)[1], 16) == port:
                    name = TCP_STATES.get(state, state)
                    found.append(f"{table[10:]} {local}->{remote} {name} inode {inode}")
    return found


def sessions(address: str) -> int:
    return len(query("devices", address=address)["processes"])


def eventually(condition, what: str, timeout: float = 60.0, seen=lambda: "") -> None:
    """Wait for `condition()`; a failure says `what` never held, and `seen()`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what} {seen()}"
        time.sleep(0.05)


class SilentStreams:
    """Raw session streams over TCP that never send a message (no hello)."""

    def __init__(self, address: str, count: int):
        self.channel = grpc.insecure_channel(address, options=service.CLIENT_CHANNEL_OPTIONS)
        self.quiet = threading.Event()
        method = self.channel.stream_stream(
            service.SESSION_METHOD,
            request_serializer=bulk.serialize,
            response_deserializer=bulk.parse_server,
        )
        metadata = [(service.TOKEN_METADATA_KEY, TOKEN)]
        self.calls = [method(self._nothing(), metadata=metadata) for _ in range(count)]

    def _nothing(self):
        self.quiet.wait()
        yield from ()

    def outcomes(self) -> list[tuple[grpc.StatusCode, str]]:
        """(status, details) of the streams that ended."""
        return [(c.code(), c.details()) for c in self.calls if c.done()]

    def close(self) -> None:
        self.quiet.set()
        for call in self.calls:
            call.cancel()
        self.channel.close()


def test_idle_tcp_sessions_neither_lock_out_unix_clients_nor_stay(start_daemon):
    port = free_port()
    # 45 s: room to open all 70 before the first 16 are ended, even on a loaded machine
    # (with 10 s, the first ones could end while the last were still opening)
    daemon = start_daemon(
        "--listen", f"127.0.0.1:{port}", "--hello-timeout", "45", env={"SIMNPU_TOKEN": TOKEN}
    )
    listening = sockets_on(port)
    assert any(s.endswith("LISTEN", 0, s.index(" inode")) for s in listening), listening
    silent = SilentStreams(f"127.0.0.1:{port}", 70)
    try:
        counts: list[int] = []  # the daemon's session counts, as polled

        def held() -> int:
            counts.append(sessions(daemon.address))
            return counts[-1]

        def refusals() -> list[str]:
            return [d for c, d in silent.outcomes() if c == grpc.StatusCode.RESOURCE_EXHAUSTED]

        def seen() -> str:
            outcomes = silent.outcomes()
            ended = collections.Counter(c.name for c, _ in outcomes)
            details = sorted({d for _, d in outcomes})[:3]
            return (
                f"(session counts polled: {sorted(set(counts))}; streams ended: {ended};"
                f" their details: {details}; sockets on port {port}: {sockets_on(port)};"
                f" daemon log: {daemon.output()[-2000:]!r})"
            )

        # every stream is answered while the first 16 hold the host's share: 54 refused
        eventually(
            lambda: held() <= 16 and len(refusals()) == 70 - 16, "the other 54 refused", seen=seen
        )
        assert max(counts) <= 16, seen()
        refused = refusals()
        assert "host ipv4:127.0.0.1 already holds 16 sessions" in refused[0]
        assert "--max-sessions-per-peer" in refused[0]
        rt = Runtime(daemon.address)  # a Unix client still gets in
        try:
            rt.contexts.set_device(0)
            round_trip(rt)
            eventually(lambda: held() == 1, "the idle sessions ended", seen=seen)
            round_trip(rt)  # the client that said hello stays
        finally:
            rt.close()
        ended = [d for c, d in silent.outcomes() if c == grpc.StatusCode.DEADLINE_EXCEEDED]
        assert len(ended) == 16 and "no hello within 45 s" in ended[0], seen()
    finally:
        silent.close()


def test_one_process_holds_at_most_its_share_of_sessions(start_daemon):
    daemon = start_daemon("--max-sessions-per-peer", "2")
    held = [Runtime(daemon.address), Runtime(daemon.address)]
    try:
        with pytest.raises(NpuError) as caught:
            Runtime(daemon.address)
        assert caught.value.code == codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL
        assert "already holds 2 sessions" in caught.value.message
        assert "--max-sessions-per-peer 2" in caught.value.message
        other = run_client(
            daemon.address,
            "from simnpu.client.runtime import Runtime\nRuntime().close()\nprint('in')",
        )
        assert other.stdout.strip() == "in", other.stderr  # another process is another peer
    finally:
        for rt in held:
            rt.close()
