"""The protocol between the daemon and a Gloo exchange process
(server/hccl/gloo_exchange_main.py): what the daemon hands it and what it reports, for the
exchange between the hosts of an HCCL world.

A world across hosts runs each collective in three phases (docs/multihost.md): the AI
cores reduce or gather the host's own ranks into a *host block* in device memory, the
hosts exchange their blocks, and the AI cores copy the result out. The middle phase is
the exchange's: one exchange process per world on each host, all of them joined through
Gloo (torch.distributed), started, fed and stopped by the daemon's `ExchangeProcess`
(server/hccl/gloo_exchange.py).

A collective's exchange starts with a `Match` of every host's call, then moves data in
steps over ranges of the host block that each host *owns* (the same ranges, relative to
the block, on every host):

  Reduce  every host ends with its own ranges reduced over all hosts, in host order
          (host 0's data first); the other ranges are left as they were
  Gather  every host's own ranges are copied into the same ranges of every other host

so all_reduce is a Reduce then a Gather over ranges cut evenly, reduce_scatter a Reduce
over each host's ranks' slices, all_gather a Gather of them, broadcast a Gather that the
root's host owns whole, and reduce a Reduce that it owns whole. An `Exchange` sends and
receives ranges each host names for itself (scatter, alltoall). A `Transfer` is one
rank's send or recv with a rank on another host, straight from or into its buffer.
Between hosts everything is point-to-point, and the reduction is numpy's in the fixed
order, never Gloo's own.

An exchange process runs one step at a time, in the order submitted; a Transfer starts as
it comes, beside the steps (even one waiting for its peers), and reports when it is done.
A step's failure (a peer lost, a step not answered within the world's timeout) ends the
exchange process: a Gloo group that lost a peer cannot be used again. The daemon then gets
the `StepFailed` and, when the process has ended, `ExchangeLost`.
"""

from __future__ import annotations

from dataclasses import dataclass

Range = tuple[int, int]  # [first byte, end byte) relative to the host block


@dataclass(frozen=True)
class ExchangeSetup:
    """What an exchange process needs to join its world's other hosts."""

    host: int  # this host's index in the world's host order
    hosts: int
    store_host: str  # where the world's TCPStore listens (the first host's process hosts it)
    store_port: int  # 0 at the first host: its process starts the store on a free port
    segment: str  # the device-memory segment (POSIX shm name) the host blocks live in
    timeout_s: float  # each step: the world's HCCL_EXEC_TIMEOUT
    form_timeout_s: float  # joining the other hosts' exchange processes (they start slowly)
    bind_host: str = ""  # the address Gloo listens on: this daemon's advertised host


@dataclass(frozen=True)
class Reduce:
    """Each host's owned ranges reduced over every host, in host order."""

    seq: int
    block: int  # the host block's offset in this host's segment
    dtype: str  # a numpy dtype name ("bfloat16" included)
    op: int  # HcclReduceOp
    owners: tuple[tuple[Range, ...], ...]  # owners[h]: host h's ranges


@dataclass(frozen=True)
class Gather:
    """Each host's owned ranges copied into the same ranges of every other host."""

    seq: int
    block: int
    owners: tuple[tuple[Range, ...], ...]


@dataclass(frozen=True)
class Match:
    """Every host's `call` (what its ranks called, MATCH_BYTES at most) compared before a
    collective's data moves: `Mismatch` if they differ."""

    seq: int
    call: bytes


@dataclass(frozen=True)
class Exchange:
    """Ranges of this host's block sent to other hosts and received from them, every one
    posted at once: `sends` and `recvs` are (peer, range) pairs. The ranges one host sends
    another are, in order, the ranges that host receives from it (scatter, alltoall)."""

    seq: int
    block: int
    sends: tuple[tuple[int, Range], ...]
    recvs: tuple[tuple[int, Range], ...]


@dataclass(frozen=True)
class Transfer:
    """One rank's HcclSend or HcclRecv with a rank on another host: bytes straight between
    the rank's buffer (`span` of device segment `segment`) and the peer host's matching
    Transfer (same `tag`, from `transfer_tag`). It runs beside the steps after it and
    reports when done, so transfers of one host may finish in any order. The receiving
    exchange process first compares the two sides' `match` (count and type): `Mismatch` with each
    side's `call` if they differ."""

    seq: int
    segment: str
    span: Range  # absolute in `segment`
    peer: int
    tag: int
    sending: bool
    match: bytes
    call: bytes


# Gloo tags: a step's ranges use tags from 0; transfers use two each (a header with the
# call, then the data) from TRANSFER_TAGS on, below 2**31 (torch passes tags as a C int)
TRANSFER_TAGS = 1 << 20
_TRANSFER_IDS = ((1 << 31) - TRANSFER_TAGS) // 2


def transfer_tag(source: int, destination: int, index: int, n_ranks: int) -> int:
    """The tag of the `index`-th send/recv from global rank `source` to `destination`:
    unique among a world's transfers in flight (indices wrap after _TRANSFER_IDS / n**2)."""
    per_pair = _TRANSFER_IDS // (n_ranks * n_ranks)
    return (source * n_ranks + destination) * per_pair + index % per_pair


@dataclass(frozen=True)
class Rebacked:
    """Before the steps that follow: page runs of this host's devices are now mapped from
    other files (server/memory/device_backing.py's Backing: segment, offset, length,
    source); `whole`: they are the whole map, and earlier changes are void."""

    changes: tuple[tuple[str, int, int, str], ...]
    whole: bool


@dataclass(frozen=True)
class Finish:
    """No more steps: the exchange process ends once the steps before are done."""


Step = Match | Reduce | Gather | Exchange | Transfer
MATCH_BYTES = 256


@dataclass(frozen=True)
class StoreListening:
    """The first host's exchange process started the world's TCPStore on this port."""

    port: int


@dataclass(frozen=True)
class Formed:
    """Every host's exchange process has joined the world."""


@dataclass(frozen=True)
class StepDone:
    seq: int


@dataclass(frozen=True)
class Mismatch:
    """A `Match` (or a Transfer's header) found calls that differ: calls[h] is host h's
    (empty for a host a Transfer does not involve). The exchange process ends."""

    seq: int
    calls: tuple[bytes, ...]


@dataclass(frozen=True)
class StepFailed:
    """A step (or, with seq -1, forming the world) failed; the exchange process ends.
    `silent`: the peer hosts whose part had not come when the world's timeout ran out
    (empty if it failed otherwise)."""

    seq: int
    message: str
    silent: tuple[int, ...] = ()


@dataclass(frozen=True)
class ExchangeLost:
    """The exchange process has ended (its pipe closed), for whatever reason."""

    exitcode: int | None


Report = StoreListening | Formed | StepDone | Mismatch | StepFailed | ExchangeLost
