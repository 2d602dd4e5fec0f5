"""Tenants: whose a client is, for what one client may see or join of another's.

A session belongs to one tenant (server/control/credentials.py decides which): the
operator (who runs the daemon: its uid or root on the Unix socket, a Unix client the daemon
cannot see, the token file's first entry on TCP), another uid on the Unix socket, or a TCP
tenant by its token's name. Job names, root infos and rank tables are scoped by tenant
(server/hccl/); the views of tools and clients show a tenant only its own processes, jobs
and memory; the operator sees everything (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tenant:
    """A tenant, by its key: "" for the operator, "uid U" for another Unix uid, "token
    NAME" for a TCP tenant. The key is what daemons pass each other for a rank of another
    host: every daemon's operator is the same tenant, so a job of two operators' clients
    forms across hosts even when the daemons run as different uids."""

    key: str

    @property
    def operator(self) -> bool:
        return self.key == ""

    def sees(self, other: Tenant) -> bool:
        """Whether this tenant may see `other`'s processes, jobs and memory."""
        return self.operator or self == other

    def __str__(self) -> str:
        return self.key or "the operator"


OPERATOR = Tenant("")
