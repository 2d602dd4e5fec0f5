"""An engine process: one host's part in the exchange between the hosts of an HCCL world.

The only module of simnpu that imports torch (the `multihost` extra), for Gloo. The
process maps the daemon's device segment, forms the world with the other hosts' engine
processes through a TCPStore that the first host's engine serves, then runs the steps
its daemon hands it (server/engine.py), one at a time, reporting each. Data moves as
bytes, straight between the mapped host blocks and the sockets; reductions are numpy's,
in host order, so that every host computes each element the same way.

A failed step ends the process after its report: a Gloo group that lost a peer cannot be
used again, and the daemon forms a new world with new engine processes.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import struct
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from simnpu.server import reduce
from simnpu.server.engine import (
    MATCH_BYTES,
    EngineSetup,
    Finish,
    Formed,
    Gather,
    Match,
    Mismatch,
    Range,
    Reduce,
    Send,
    Step,
    StepDone,
    StepFailed,
    StoreListening,
)
from simnpu.server.workers import end_with_daemon
from simnpu.shm.region import Region


class _Exchange:
    """This host's end of a formed Gloo world over a mapped segment."""

    def __init__(self, setup: EngineSetup, memory: Any):
        import torch
        import torch.distributed as dist

        self._dist = dist
        self._host = setup.host
        self._hosts = setup.hosts
        self._timeout = datetime.timedelta(seconds=setup.timeout_s)
        self._bytes = torch.from_numpy(np.frombuffer(memory, np.uint8))
        self._scratch: dict[tuple[int, int], Any] = {}  # (range index, peer) -> its buffer

    def _receive_buffer(self, index: int, peer: int, nbytes: int) -> Any:
        """A buffer kept from step to step: a new one would fault in its pages each time."""
        import torch

        buffer = self._scratch.get((index, peer))
        if buffer is None or len(buffer) < nbytes:
            buffer = self._scratch[index, peer] = torch.empty(nbytes, dtype=torch.uint8)
        return buffer[:nbytes]

    def run(self, step: Step) -> tuple[bytes, ...] | None:
        """Run `step`; for a Match, every host's call if they differ."""
        if isinstance(step, Match):
            return self._match(step)
        if isinstance(step, Reduce):
            self._reduce(step)
        elif isinstance(step, Gather):
            self._gather(step)
        else:
            move = self._dist.isend if isinstance(step, Send) else self._dist.irecv
            self._wait([move(self._span(step.block, step.span), step.peer, tag=step.tag)])
        return None

    def _match(self, step: Match) -> tuple[bytes, ...] | None:
        import torch

        mine = torch.zeros(MATCH_BYTES, dtype=torch.uint8)
        call = step.call[:MATCH_BYTES]
        mine[: len(call)] = torch.frombuffer(bytearray(call), dtype=torch.uint8)
        theirs = {h: torch.empty(MATCH_BYTES, dtype=torch.uint8) for h in range(self._hosts)}
        theirs[self._host] = mine
        works = []
        for peer in range(self._hosts):
            if peer != self._host:
                works.append(self._dist.isend(mine, peer, tag=0))
                works.append(self._dist.irecv(theirs[peer], peer, tag=0))
        self._wait(works)
        calls = tuple(bytes(theirs[h].numpy()).rstrip(b"\0") for h in range(self._hosts))
        return None if len(set(calls)) == 1 else calls

    def _span(self, block: int, span: Range) -> Any:
        return self._bytes[block + span[0] : block + span[1]]

    def _wait(self, works: list) -> None:
        for work in works:
            work.wait(self._timeout)

    def _reduce(self, step: Reduce) -> None:
        dist, me = self._dist, self._host
        works = []
        for peer, ranges in enumerate(step.owners):  # what each other host reduces
            if peer != me:
                for tag, span in enumerate(ranges):
                    works.append(dist.isend(self._span(step.block, span), peer, tag=tag))
        mine = step.owners[me]
        received: list[list[Any]] = []  # received[i][h]: host h's data for my range i
        for tag, span in enumerate(mine):
            per_host: list[Any] = []
            for peer in range(self._hosts):
                if peer == me:
                    per_host.append(None)
                    continue
                buffer = self._receive_buffer(tag, peer, span[1] - span[0])
                works.append(dist.irecv(buffer, peer, tag=tag))
                per_host.append(buffer)
            received.append(per_host)
        self._wait(works)
        dtype = reduce.numpy_dtype(step.dtype)
        ufunc = reduce.reduce_ufunc(step.op)
        with np.errstate(all="ignore"):  # overflow is the data's business, as on the device
            for span, per_host in zip(mine, received):
                out = self._span(step.block, span).numpy().view(dtype)
                own = out if me < 2 else out.copy()  # read after out is first written
                parts = [own if b is None else b.numpy().view(dtype) for b in per_host]
                ufunc(parts[0], parts[1], out=out)  # host 0 first, then 1, 2, ...
                for part in parts[2:]:
                    ufunc(out, part, out=out)

    def _gather(self, step: Gather) -> None:
        dist, me = self._dist, self._host
        works = []
        for peer in range(self._hosts):
            if peer == me:
                continue
            for tag, span in enumerate(step.owners[me]):
                works.append(dist.isend(self._span(step.block, span), peer, tag=tag))
            for tag, span in enumerate(step.owners[peer]):
                works.append(dist.irecv(self._span(step.block, span), peer, tag=tag))
        self._wait(works)


def _form(setup: EngineSetup, conn: Connection) -> None:
    """Join the world (blocks until every host's engine has, or the timeout)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=setup.form_timeout_s)
    serve = setup.store_port == 0
    store = dist.TCPStore(
        setup.store_host,
        setup.store_port,
        setup.hosts,
        is_master=serve,
        timeout=timeout,
        wait_for_workers=False,
    )
    if serve:
        conn.send(StoreListening(store.port))
    if setup.bind_host and not os.environ.get("GLOO_SOCKET_IFNAME"):
        # Gloo listens on the interface of the daemon's advertised address, not where this
        # host's name resolves (often 127.0.1.1); GLOO_SOCKET_IFNAME, if set, decides
        interface = interface_of(setup.bind_host)
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    dist.init_process_group(
        "gloo", store=store, rank=setup.host, world_size=setup.hosts, timeout=timeout
    )


_SIOCGIFADDR = 0x8915  # ioctl(2): an interface's IPv4 address


def interface_of(host: str) -> str | None:
    """The name of this machine's network interface that holds `host`'s IPv4 address, or
    None (not an IPv4 address of this machine, or it does not resolve)."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode())
                )
            except OSError:  # no IPv4 address
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


def main(conn: Connection, setup: EngineSetup) -> None:
    """Entry point of a spawned engine process: form the world, then run steps until the
    pipe closes or a step fails."""
    end_with_daemon()
    seq = -1
    try:
        try:
            region = Region.attach(setup.segment, device=True)
        except Exception as exc:  # noqa: BLE001 - named, then reported like any failure
            raise RuntimeError(f"cannot map device segment {setup.segment}: {exc}") from exc
        _form(setup, conn)
        conn.send(Formed())
        exchange = _Exchange(setup, region.map)
        while True:
            try:
                step = conn.recv()
            except EOFError:
                return
            if isinstance(step, Finish):
                return
            seq = step.seq
            differ = exchange.run(step)
            if differ is not None:  # the world breaks: the steps after it cannot match
                conn.send(Mismatch(seq, differ))
                return
            conn.send(StepDone(seq))
    except Exception as exc:  # noqa: BLE001 - reported to the daemon, then the process ends
        message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        try:
            conn.send(StepFailed(seq, message))
        except OSError:
            pass
