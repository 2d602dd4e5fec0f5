"""Who is at the other end of a session: the credentials sockets (simnpu.proto.
peer_credentials), their one-time tickets, the peer a session is counted against, and the
tenant it belongs to.

A peer is what the per-peer session limit counts (--max-sessions-per-peer): a process
(uid and pid from SO_PEERCRED) when the client presented a ticket, else the remote host of
a TCP connection, else "a Unix client without credentials" as one peer.

A tenant (server/core/tenants.py) is whose the client is: on TCP, the token file's entry
whose token it sent (the first entry is the operator's); on the Unix socket, its uid (the
daemon's own uid and root are the operator); Unix clients without credentials are one
tenant of their own (a uid the operator let in could otherwise pass for the operator by
presenting no ticket).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass

from simnpu.proto import peer_credentials
from simnpu.server.core.tenants import OPERATOR, Tenant

UNVERIFIED = Tenant("unix without credentials")  # Unix clients that presented no ticket

log = logging.getLogger("simnpu.peers")

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_OUTSTANDING_TICKETS = 4096  # tickets issued and not yet presented (the oldest go first)


@dataclass(frozen=True)
class Peer:
    key: str  # what the per-peer session limit counts, for messages too
    pid: int  # the client's process as the daemon sees it (SO_PEERCRED); 0: not verified
    uid: int | None = None  # its uid (SO_PEERCRED); None: not verified


class Tenancy:
    """The tenants of a daemon: the tokens TCP clients may send, and the daemon's uid."""

    def __init__(self, operator_token: str | None, tenants: tuple[tuple[str, str], ...]):
        self._tokens = [(OPERATOR, operator_token)] if operator_token else []
        self._tokens += [(Tenant(f"token {name}"), token) for name, token in tenants]
        self._uid = os.getuid()

    def of_token(self, presented: str) -> Tenant | None:
        """The tenant whose token `presented` is (None: nobody's). Compares with every
        token, each in constant time."""
        found = None
        for tenant, token in self._tokens:
            if hmac.compare_digest(presented.encode(), token.encode()):
                found = tenant
        return found

    def of_unix(self, peer: Peer) -> Tenant:
        """The tenant of a Unix-socket client `peer`."""
        if peer.uid is None:
            return UNVERIFIED
        if peer.uid in (self._uid, 0):
            return OPERATOR
        return Tenant(f"uid {peer.uid}")


@dataclass(frozen=True)
class _Ticket:
    pid: int
    uid: int
    expires: float  # time.monotonic()


class Peers:
    """The daemon's credentials sockets and the tickets they issued. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets: dict[bytes, _Ticket] = {}
        self._listeners: list[tuple[socket.socket, str]] = []

    def listen(self, session_socket: str) -> None:
        """Open the credentials socket beside the Unix socket `session_socket` (whose folder
        the daemon checked) and answer it on a thread of its own."""
        path = peer_credentials.socket_path(session_socket)
        try:
            os.unlink(path)  # left behind by a daemon that died (the session socket was free)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        previous = os.umask(0o177)  # born 0600, like the session socket
        try:
            listener.bind(path)
        finally:
            os.umask(previous)
        listener.listen(64)
        self._listeners.append((listener, path))
        threading.Thread(
            target=self._answer, args=(listener,), name="simnpu-credentials", daemon=True
        ).start()

    def close(self) -> None:
        """Stop answering; remove the credentials sockets."""
        for listener, path in self._listeners:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes its thread's accept()
            except OSError:
                pass
            listener.close()
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._listeners.clear()

    def identify(self, peer: str, ticket: str) -> Peer:
        """The peer of a session: `peer` is gRPC's name of the connection (context.peer()),
        `ticket` the one it presented (hex; "" if none)."""
        found = self._redeem(ticket)
        if found is not None and found.pid:
            return Peer(f"uid {found.uid} pid {found.pid}", found.pid, found.uid)
        if found is not None:
            return Peer(f"uid {found.uid} (a process this daemon cannot see)", 0, found.uid)
        if peer.startswith("unix:"):
            return Peer("Unix clients without credentials", 0)
        host = peer.rsplit(":", 1)[0]  # ipv4:10.0.0.2:53422 -> ipv4:10.0.0.2
        return Peer(f"host {host}", 0)

    def _redeem(self, ticket: str) -> _Ticket | None:
        try:
            key = bytes.fromhex(ticket)
        except ValueError:
            return None
        with self._lock:
            found = self._tickets.pop(key, None)
        return found if found is not None and found.expires > time.monotonic() else None

    def _answer(self, listener: socket.socket) -> None:
        """Answer every connection at once with the pid it comes from and a new ticket (the
        reply fits in the socket's buffer: a client that never reads holds nothing up)."""
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the daemon stops
                return
            with connection:
                try:
                    pid, uid, _ = _UCRED.unpack(
                        connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
                    )
                    connection.sendall(peer_credentials.REPLY.pack(pid, self._issue(pid, uid)))
                except OSError as error:  # the client went away at once
                    log.debug("credentials socket: %s", error)

    def _issue(self, pid: int, uid: int) -> bytes:
        ticket = secrets.token_bytes(peer_credentials.TICKET_BYTES)
        now = time.monotonic()
        with self._lock:
            for key in [k for k, t in self._tickets.items() if t.expires <= now]:
                del self._tickets[key]
            while len(self._tickets) >= MAX_OUTSTANDING_TICKETS:
                del self._tickets[next(iter(self._tickets))]
            self._tickets[ticket] = _Ticket(pid, uid, now + peer_credentials.TICKET_LIFETIME_S)
        return ticket
