"""Who a client is, as the operating system says (docs/security.md, "Who a client is
(pids)"): the credentials socket's protocol.

gRPC does not tell the daemon the process at the other end of a Unix socket, and the pid a
client writes in its hello is only what it claims. So next to every Unix socket the daemon
listens on a second one, the credentials socket (same folder, mode 0600). A client
connects to it before it opens its session; the daemon reads the connection's SO_PEERCRED
(the pid as the daemon's pid namespace sees it, and the uid) and answers with that pid and
a one-time ticket. The client presents the ticket in its session's metadata; the daemon
binds the pid to the session. A ticket is good once, for TICKET_LIFETIME_S, and only says
which process asked for it: a process can hand its own ticket to another, never obtain one
for a process other than itself.
"""

from __future__ import annotations

import struct

TICKET_METADATA_KEY = "simnpu-peer-ticket"
TICKET_BYTES = 16
TICKET_LIFETIME_S = 60.0
REPLY = struct.Struct("<q16s")  # the pid the daemon sees (0: not visible to it), the ticket


def socket_path(session_socket: str) -> str:
    """The credentials socket beside the Unix socket `session_socket`."""
    return session_socket + ".cred"
