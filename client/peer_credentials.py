"""This process as the daemon sees it: a ticket from the credentials socket beside the
daemon's Unix socket (simnpu.proto.peer_credentials), presented when the session opens,
which binds the daemon-visible pid to the session (the pid aclrtDeviceGetBareTgid returns
and IPC whitelists hold)."""

from __future__ import annotations

import os
import socket

from simnpu.client import config
from simnpu.proto import peer_credentials

TIMEOUT_S = 30.0
"""The daemon answers at once; this bounds only a daemon that stopped answering. A shorter
bound let a client on a starved machine go on without its ticket, unverified: outside its
process's session limit and every IPC whitelist."""


def ask(address: str) -> tuple[int, list[tuple[str, str]]]:
    """(this process's pid as the daemon at `address` sees it, the session metadata that
    presents its one-time ticket). The pid is 0, unverified, when this process is not
    visible in the daemon's pid namespace; (0, []) over TCP, or when the daemon has no
    credentials socket or it cannot be reached. Blocks (at most TIMEOUT_S)."""
    path = config.parse(address).path
    if path is None:
        return 0, []
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(TIMEOUT_S)
    try:
        probe.connect(peer_credentials.socket_path(os.path.abspath(path)))
        reply = b""
        while len(reply) < peer_credentials.REPLY.size:
            chunk = probe.recv(peer_credentials.REPLY.size - len(reply))
            if not chunk:
                return 0, []
            reply += chunk
    except OSError:
        return 0, []
    finally:
        probe.close()
    pid, ticket = peer_credentials.REPLY.unpack(reply)
    return pid, [(peer_credentials.TICKET_METADATA_KEY, ticket.hex())]
