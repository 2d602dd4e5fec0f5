"""Forming worlds across hosts with other daemons, and the messages between them
(docs/multihost.md).

A root info carries its daemon's advertised address. A rank that joins with another
daemon's root info (or a rank table whose first server is another daemon's) makes its
own daemon a *member* of the world: the daemon opens a Peer stream
(server/hccl/daemon_links.py) to that daemon, the *coordinator*, and forwards the join
(PeerJoin). The coordinator counts remote joins in the rendezvous like local ones
(server/hccl/communicators.py). When every rank has joined it numbers the hosts by their
lowest rank (or a rank table's server order) and sends the layout to every member
(PeerFormed); each daemon then makes a `Communicator` of its own ranks, with the others as
`RemoteRank`s, and a `World` (server/hccl/world.py). A failed join comes back as a
PeerFailed.

Once it has formed, the hosts tell each other, through the coordinator, where the
exchange's store listens (PeerStore), that the world broke (PeerFailed) and that every
rank of a host destroyed the communicator (PeerLeft); a Peer stream that ends loses its
host, which breaks the world. `Worlds` holds every world of this daemon, those forming
and those formed.

Everything here runs under the scheduler lock; links report through `scheduler.call`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simnpu.proto import hccl_types as ht
from simnpu.proto import npu_pb2 as pb
from simnpu.server.core.tenants import Tenant
from simnpu.server.hccl.communicators import HcclFailure, RemoteRank
from simnpu.server.hccl.daemon_links import Incoming, Link, Outgoing
from simnpu.server.hccl.failure_codes import MISMATCH, REMOTE, TIMEOUT
from simnpu.server.hccl.world import World, store_host

if TYPE_CHECKING:
    from simnpu.server.hccl.collectives import Collectives
    from simnpu.server.hccl.communicators import Communicator, Member

log = logging.getLogger("simnpu.worlds")


@dataclass(eq=False)
class _Joining:
    """At a member: this daemon's ranks waiting in a world's rendezvous at a coordinator."""

    coordinator: str
    comm_id: int
    link: Link
    cluster: bool  # joined with a rank table (HcclCommInitClusterInfo), not a root info
    admits: tuple[bytes, Tenant]  # the (root info secret, tenant) its link presented
    members: dict = field(default_factory=dict)  # rank -> (Member, request id)


class Worlds:
    """The worlds across hosts this daemon takes part in (scheduler-owned)."""

    def __init__(self, collectives: Collectives):
        self.collectives = collectives
        self.advertise: str | None = None  # set by the daemon: --advertise
        self.token: str = ""
        self._joining: dict[tuple, _Joining] = {}  # (coordinator, comm id or table key) ->
        self._incoming: dict[int, list[Link]] = {}  # comm id -> member links (coordinator)
        self._comm_of: dict[Link, int] = {}  # a member link -> the comm id it joins
        # a member link -> its rank table's key and tenant
        self._tables: dict[Link, tuple[bytes, Tenant]] = {}
        self.formed: dict[int, World] = {}  # local communicator id -> its world
        self.stopped = False  # the daemon stops: device memory goes with it

    @property
    def communicators(self):
        return self.collectives.communicators

    def _call(self, function: Callable, *args: object) -> None:
        self.collectives.scheduler.call(function, *args)

    # ---- at a member --------------------------------------------------------------------------
    def join_remote(
        self,
        member: Member,
        coordinator: str,
        nonce: bytes,
        connect_timeout_s: float,
        request_id: int,
        secret: bytes = b"",
        table_key: bytes = b"",
        exec_timeout_s: float = 0.0,
    ) -> None:
        """A local rank joins a world that forms at another daemon: the root info's (with
        its `secret`), or (`table_key`: its tenant's) the first server's of a rank table.
        Its tenant and the secret go with the link's hello: the coordinator admits the link
        or not, so a later rank of this daemon on the same link must present the same."""
        if self.advertise is None:
            raise HcclFailure(
                ht.HCCL_E_PARA,
                f"the root info was issued by the daemon at {coordinator}; this daemon takes "
                "part in worlds across hosts only with --advertise (docs/multihost.md)",
            )
        key = (coordinator, table_key or member.comm_id)
        joining = self._joining.get(key)
        admits = (secret, member.session.tenant)
        if joining is not None and joining.admits != admits:
            raise HcclFailure(
                ht.HCCL_E_PARA,
                f"the root info of communicator {member.comm_id} was made up, or issued to "
                "another tenant: a rank joins with the bytes HcclGetRootInfo gave a process "
                "of its own tenant (docs/security.md)",
            )
        if joining is None:
            hello = pb.PeerHello(
                comm_id=member.comm_id,
                nonce=nonce,
                address=self.advertise,
                table_key=table_key,
                secret=secret,
                tenant=member.session.tenant.key,
            )
            link = Outgoing(
                coordinator,
                self.token,
                hello,
                lambda link, message: self._call(self._member_message, key, message),
                lambda link, reason: self._call(self._member_link_ended, key, reason),
            )
            joining = self._joining[key] = _Joining(
                coordinator, member.comm_id, link, cluster=bool(table_key), admits=admits
            )
        joining.members[member.rank] = (member, request_id)
        join = pb.PeerJoin(
            rank=member.rank,
            n_ranks=member.n_ranks,
            device=member.device,
            pid=getattr(member.session, "pid", 0),
            connect_timeout_s=connect_timeout_s,
        )
        if table_key and member.rank == 0:
            join.exec_timeout_s = exec_timeout_s
        joining.link.send(pb.PeerMessage(join=join))

    def _member_message(self, key: tuple, message: pb.PeerMessage) -> None:
        joining = self._joining.get(key)
        world = None if joining is not None else self._world_of_link(key)
        body = message.WhichOneof("body")
        if joining is not None:
            if body == "formed":
                self._member_formed(key, joining, message.formed)
            elif body == "failed":
                self._member_rejected(key, joining, message.failed)
            return
        if world is None:
            return
        if body == "store":
            world.start_exchange(message.store.host, message.store.port)
        elif body == "failed":
            failed = message.failed
            self.break_world(world, failed.message, _outcome(failed.result), tell=False)
        elif body == "left":
            self.host_left(world, message.left.message)

    def _world_of_link(self, key: tuple) -> World | None:
        for world in self.formed.values():
            if world.remote_key == key:
                return world
        return None

    def _member_formed(self, key, joining: _Joining, formed: pb.PeerFormed) -> None:
        del self._joining[key]
        hosts = tuple((h.address, tuple(h.ranks)) for h in formed.hosts)
        members = [member for member, _ in joining.members.values()]
        n_ranks = members[0].n_ranks
        host = next(i for i, (address, _) in enumerate(hosts) if address == self.advertise)
        world_members: list = [None] * n_ranks
        for address, ranks in hosts:
            for rank in ranks:
                world_members[rank] = RemoteRank(
                    rank, n_ranks, -1, 0, address, joining.comm_id, state="ready"
                )
        for member in members:
            world_members[member.rank] = member
        reply_type = pb.HcclCommInitClusterReply if joining.cluster else pb.HcclCommInitReply
        comm = self.communicators.form_world_communicator(
            world_members, formed.exec_timeout_s, joining.members.values(), reply_type
        )
        world = World(
            self,
            comm,
            hosts,
            host,
            formed.exec_timeout_s,
            [joining.link],
            coordinator=False,
            remote_key=key,
        )
        self._attach(world, members)

    def _member_rejected(self, key, joining: _Joining, failed: pb.PeerFailed) -> None:
        if failed.HasField("rank"):
            entry = joining.members.pop(failed.rank, None)
            if entry is not None:
                self.communicators.reject(entry[0], entry[1], failed.result, failed.message)
            if joining.members:
                return
        del self._joining[key]
        joining.link.close()
        for member, request_id in joining.members.values():
            self.communicators.reject(member, request_id, failed.result, failed.message)

    def _member_link_ended(self, key: tuple, reason: str) -> None:
        joining = self._joining.pop(key, None)
        if joining is not None:
            for member, request_id in joining.members.values():
                self.communicators.reject(
                    member,
                    request_id,
                    ht.HCCL_E_TCP_CONNECT,
                    f"cannot reach the daemon at {key[0]}, where the world forms (the root "
                    f"info's daemon, or that of the rank table's first server): {reason}",
                )
            return
        world = self._world_of_link(key)
        if world is not None and world.left is None:  # (after a PeerLeft the stream ends)
            self.break_world(
                world,
                f"lost the coordinator, {world.describe_host(key[0])}: {reason}",
                tell=False,
            )

    def member_left(self, member: Member) -> None:
        """A joining local rank's session ended: the world cannot form."""
        for key, joining in list(self._joining.items()):
            if joining.members.get(member.rank, (None,))[0] is member:
                joining.link.send(
                    pb.PeerMessage(
                        failed=pb.PeerFailed(
                            result=ht.HCCL_E_REMOTE,
                            message=f"{member.describe()} on host {self.advertise} ended before "
                            f"every rank joined communicator {member.comm_id}",
                        )
                    )
                )
                del joining.members[member.rank]

    # ---- at the coordinator ------------------------------------------------------------------
    def accept(self, hello: pb.PeerHello) -> Incoming:
        """A member daemon's Peer stream (on a gRPC thread): its link."""
        link = Incoming(
            hello.address,
            lambda link, message: self._call(self._coordinator_message, link, message),
            lambda link, reason: self._call(self._coordinator_link_ended, link, reason),
        )
        self._call(self._accepted, link, hello)
        return link

    def _accepted(self, link: Link, hello: pb.PeerHello) -> None:
        tenant = Tenant(hello.tenant)  # (a member daemon speaks with the operator's token)
        if hello.table_key:  # its rendezvous: the table's open one, else a new one
            comm_id = self.communicators.table_comm_id(hello.table_key, 0, 0, tenant)
            self._tables[link] = (hello.table_key, tenant)
        else:
            comm_id = hello.comm_id
            problem = self.communicators.remote_problem(comm_id, hello.nonce, hello.secret, tenant)
            if problem is not None:
                failed = pb.PeerFailed(result=problem[0], message=problem[1])
                link.send(pb.PeerMessage(failed=failed))
                link.close()
                return
        self._comm_of[link] = comm_id
        self._incoming.setdefault(comm_id, []).append(link)

    def _coordinator_message(self, link: Link, message: pb.PeerMessage) -> None:
        body = message.WhichOneof("body")
        world = self._world_of_incoming(link)
        comm_id = self._comm_of.get(link)
        if body == "join" and world is None and comm_id is not None:
            join = message.join
            remote = RemoteRank(
                join.rank, join.n_ranks, join.device, join.pid, link.address, comm_id, link
            )
            table = self._tables.get(link)
            if table is None:
                self.communicators.join_remote(remote, join.connect_timeout_s)
            else:
                self.communicators.join_remote_table(
                    remote, *table, join.connect_timeout_s, join.exec_timeout_s
                )
        elif body == "failed":
            failed = message.failed
            if world is not None:
                self.break_world(world, failed.message, _outcome(failed.result), origin=link)
            elif comm_id is not None:
                self.communicators.fail_open(comm_id, failed.result, failed.message)
        elif body == "store" and world is not None:
            self.relay_store(world, message.store.host, message.store.port, origin=link)
        elif body == "left" and world is not None:
            self.host_left(world, message.left.message, origin=link)

    def _world_of_incoming(self, link: Link) -> World | None:
        for world in self.formed.values():
            if world.coordinator and link in world.links:
                return world
        return None

    def _coordinator_link_ended(self, link: Link, reason: str) -> None:
        comm_id = self._comm_of.pop(link, None)
        self._tables.pop(link, None)
        world = self._world_of_incoming(link)
        if world is not None:
            if world.left is None:  # (after a PeerLeft the stream ends)
                self.break_world(world, f"lost {world.describe_host(link.address)}: {reason}")
            return
        links = self._incoming.get(comm_id) if comm_id is not None else None
        if comm_id is not None and links is not None and link in links:
            links.remove(link)
            self.communicators.fail_open(
                comm_id,
                ht.HCCL_E_REMOTE,
                f"lost host {link.address} before every rank joined communicator {comm_id}: "
                f"{reason}",
                host=link.address,
            )

    def reject_remote(self, remote: RemoteRank, result: int, message: str) -> None:
        """A remote rank's join failed at the coordinator (the rendezvous, or the rank)."""
        if remote.link is not None:
            remote.link.send(
                pb.PeerMessage(
                    failed=pb.PeerFailed(result=result, message=message, rank=remote.rank)
                )
            )

    def coordinator_formed(
        self, comm: Communicator, exec_timeout_s: float, host_order: tuple = ()
    ) -> None:
        """The coordinator's rendezvous formed with remote ranks: lay the hosts out (in
        `host_order`, a rank table's server order, else by their lowest rank), tell the
        members, and make this daemon's world."""
        assert self.advertise is not None
        by_host: dict[str, list[int]] = {}
        for member in comm.members:
            address = member.host if isinstance(member, RemoteRank) else self.advertise
            by_host.setdefault(address, []).append(member.rank)

        def place(host: tuple) -> tuple:
            address, ranks = host
            return (host_order.index(address) if address in host_order else -1, ranks[0])

        hosts = tuple(sorted(((a, tuple(sorted(r))) for a, r in by_host.items()), key=place))
        links: dict[str, Link] = {}
        for member in comm.members:
            if isinstance(member, RemoteRank) and member.link is not None:
                links[member.host] = member.link
        formed = pb.PeerFormed(
            hosts=[pb.PeerHost(address=a, ranks=list(r)) for a, r in hosts],
            exec_timeout_s=exec_timeout_s,
        )
        for link in links.values():
            link.send(pb.PeerMessage(formed=formed))
        for link in self._incoming.pop(comm.id, []):
            self._comm_of.pop(link, None)
            self._tables.pop(link, None)
            if link not in links.values():  # a member whose ranks were all refused
                link.close()
        host = next(i for i, (address, _) in enumerate(hosts) if address == self.advertise)
        world = World(
            self, comm, hosts, host, exec_timeout_s, list(links.values()), coordinator=True
        )
        self._attach(world, [m for m in comm.members if not isinstance(m, RemoteRank)])

    def rendezvous_ended(self, comm_id: int) -> None:
        """A rendezvous failed at the coordinator: its member links close."""
        for link in self._incoming.pop(comm_id, []):
            self._comm_of.pop(link, None)
            self._tables.pop(link, None)
            link.close()

    # ---- both -----------------------------------------------------------------------------
    def _attach(self, world: World, members: list) -> None:
        world.comm.world = world
        world.device = min(members, key=lambda m: m.rank).device
        self.formed[world.comm.id] = world
        if world.host == 0:
            world.start_exchange(store_host(world.hosts[0][0]), 0)

    def relay_store(self, world: World, host: str, port: int, origin: Link | None = None) -> None:
        """Where the exchange's store listens: passed on to the other hosts, then used here."""
        message = pb.PeerMessage(store=pb.PeerStore(host=host, port=port))
        for link in world.links:
            if link is not origin:
                link.send(message)
        world.start_exchange(host, port)

    def break_world(
        self,
        world: World,
        message: str,
        outcome: tuple = REMOTE,
        tell: bool = True,
        origin: Link | None = None,
    ) -> None:
        """The world is broken: tell the other hosts (through the coordinator), fail what
        it holds with `outcome` (MISMATCH or REMOTE) and every later collective with
        REMOTE, stop its exchange process."""
        if world.broken is not None:
            return
        world.broken = message
        log.info("world of communicator %d broken: %s", world.comm.id, message)
        if tell or world.coordinator:
            failed = pb.PeerMessage(failed=pb.PeerFailed(result=outcome[1], message=message))
            for link in world.links:
                if link is not origin:
                    link.send(failed)
        world.fail_queued(message, outcome)
        self.collectives.break_communicator(world.comm, message)
        world.release(graceful=False)
        self.formed.pop(world.comm.id, None)

    def host_left(self, world: World, message: str, origin: Link | None = None) -> None:
        """Every rank of another host destroyed the communicator: what runs here finishes,
        nothing starts after it."""
        if world.broken is not None or world.left is not None:
            return
        world.left = message
        if world.coordinator:
            for link in world.links:
                if link is not origin:
                    link.send(pb.PeerMessage(left=pb.PeerLeft(message=message)))
        held = list(world.queue)
        world.queue.clear()
        for op, tasks in held:
            self.collectives.finish_world_op(world.comm, op, tasks, message)
        self.collectives.break_communicator(world.comm, message)
        world.settle()

    def communicator_done(self, comm: Communicator) -> None:
        """Every local rank of a world's communicator destroyed it or ended, and it runs
        nothing: tell the other hosts; the world is over here."""
        world = self.formed.get(comm.id)
        if world is None or world.broken is not None or world.busy():
            return
        if world.left is None:
            message = f"every rank of {world.here()} destroyed communicator {comm.id}"
            for link in world.links:
                link.send(pb.PeerMessage(left=pb.PeerLeft(message=message)))
        self.world_over(world)

    def world_over(self, world: World) -> None:
        """The world ran its last collective here: its exchange process ends once that is
        done."""
        world.broken = world.left or "the communicator was destroyed"
        world.release(graceful=True)
        self.formed.pop(world.comm.id, None)

    def stop(self) -> None:
        """The daemon stops: every world here ends (and worlds whose exchange processes are still
        ending leave their host blocks to go with the device memory)."""
        self.stopped = True
        for world in list(self.formed.values()):
            world.broken = "the daemon stopped"
            world.release(graceful=False)
        self.formed.clear()
        for joining in self._joining.values():
            joining.link.close()
        self._joining.clear()


def _outcome(result: int) -> tuple:
    """The (ACL code, HcclResult) that a relayed failure's HcclResult stands for."""
    return {MISMATCH[1]: MISMATCH, TIMEOUT[1]: TIMEOUT}.get(result, REMOTE)
