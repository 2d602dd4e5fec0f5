"""A Gloo exchange process: one host's part in the exchange between the hosts of an HCCL
world.

The only module of simnpu that imports torch (the `multihost` extra), for Gloo. The
process maps the daemon's device segment, forms the world with the other hosts' exchange
processes through a TCPStore that the first host's process serves, then runs the steps
its daemon hands it (server/hccl/gloo_exchange_protocol.py), one at a time on a thread of
their own, reporting each. A Transfer starts as it comes, even while a step waits for its
peers, and is waited for on a thread of its own. Data moves as bytes, straight
between the mapped segments and the sockets; reductions are numpy's, in host order, so
that every host computes each element the same way.

A failed step or transfer ends the process after its report: a Gloo group that lost a
peer cannot be used again, and the daemon forms a new world with new exchange processes.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import queue
import socket
import struct
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import numpy as np

from simnpu.server.hccl.gloo_exchange_protocol import (
    MATCH_BYTES,
    TRANSFER_TAGS,
    Exchange,
    ExchangeSetup,
    Finish,
    Formed,
    Gather,
    Match,
    Mismatch,
    Range,
    Rebacked,
    Reduce,
    Step,
    StepDone,
    StepFailed,
    StoreListening,
    Transfer,
)
from simnpu.server.units import collective_pieces
from simnpu.server.units.daemon_child import end_with_daemon
from simnpu.shm import window
from simnpu.shm.region import Region


class _StepError(Exception):
    """A step failed; `silent`: the peers whose part had not come by the world's timeout."""

    def __init__(self, message: str, silent: tuple[int, ...] = ()):
        super().__init__(message)
        self.silent = silent


class _Reports:
    """The pipe to the daemon, shared by the steps' thread and the transfers' threads."""

    def __init__(self, conn: Connection):
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, report: object) -> None:
        with self._lock:
            self._conn.send(report)

    def last(self, report: object) -> NoReturn:
        """Send `report` and end the process at once (from any thread): its Gloo group is
        of no more use."""
        try:
            self.send(report)
        except OSError:
            pass
        os._exit(1)


class _Gloo:
    """This host's end of a formed Gloo world, over the daemon's mapped device segments."""

    def __init__(self, setup: ExchangeSetup, region: Region, reports: _Reports):
        import torch.distributed as dist

        self._dist = dist
        self._host = setup.host
        self._hosts = setup.hosts
        self._timeout_s = setup.timeout_s
        self._reports = reports
        self._regions = {setup.segment: region}
        self._segments = {setup.segment: _bytes_of(region)}
        self._backing: list[tuple[str, int, int, str]] = []  # every change of backing so far
        self._bytes = self._segments[setup.segment]
        self._scratch: dict[tuple[int, int], Any] = {}  # (range index, peer) -> its buffer
        self._transfers: list[threading.Thread] = []

    def _receive_buffer(self, index: int, peer: int, nbytes: int) -> Any:
        """A buffer kept from step to step: a new one would fault in its pages each time."""
        import torch

        buffer = self._scratch.get((index, peer))
        if buffer is None or len(buffer) < nbytes:
            buffer = self._scratch[index, peer] = torch.empty(nbytes, dtype=torch.uint8)
        return buffer[:nbytes]

    def run_steps(self, steps: queue.SimpleQueue) -> None:
        """The steps' thread: run the steps in order until None, reporting each."""
        seq = -1
        try:
            while (step := steps.get()) is not None:
                seq = step.seq
                differ = self._run(step)
                if differ is not None:  # the world breaks: the steps after it cannot match
                    self._reports.last(Mismatch(seq, differ))
                self._reports.send(StepDone(seq))
        except _StepError as error:
            self._reports.last(StepFailed(seq, str(error), error.silent))
        except Exception as exc:  # noqa: BLE001 - reported to the daemon, then the process ends
            self._reports.last(StepFailed(seq, _describe(exc)))

    def _run(self, step: Step) -> tuple[bytes, ...] | None:
        """Run `step`; for a Match, every host's call if they differ."""
        if isinstance(step, Match):
            return self._match(step)
        if isinstance(step, Reduce):
            self._reduce(step)
        elif isinstance(step, Gather):
            mine = step.owners[self._host]
            sends = [(p, span) for p in self._peers() for span in mine]
            recvs = [(p, span) for p in self._peers() for span in step.owners[p]]
            self._exchange(step.block, sends, recvs)
        elif isinstance(step, Exchange):
            self._exchange(step.block, step.sends, step.recvs)
        return None

    def wait_for_transfers(self) -> None:
        for thread in self._transfers:
            thread.join()

    def _peers(self) -> list[int]:
        return [peer for peer in range(self._hosts) if peer != self._host]

    def _match(self, step: Match) -> tuple[bytes, ...] | None:
        mine = _header(step.call)
        theirs = {h: _header(b"") for h in self._peers()}
        works = []
        for peer in self._peers():
            works.append((peer, self._dist.isend(mine, peer, tag=0)))
            works.append((peer, self._dist.irecv(theirs[peer], peer, tag=0)))
        self._wait(works)
        theirs[self._host] = mine
        calls = tuple(_unpad(theirs[h]) for h in range(self._hosts))
        return None if len(set(calls)) == 1 else calls

    def _span(self, block: int, span: Range) -> Any:
        return self._bytes[block + span[0] : block + span[1]]

    def _wait(self, works: list) -> None:
        """Wait for (peer, work) pairs: a failure names the peers of works not done when
        the world's timeout ran out."""
        started = time.monotonic()
        for _, work in works:
            try:
                work.wait(datetime.timedelta(seconds=self._timeout_s))
            except Exception as exc:  # noqa: BLE001 - Gloo's RuntimeError, named below
                silent: tuple[int, ...] = ()
                if time.monotonic() - started >= self._timeout_s:
                    silent = tuple(sorted({peer for peer, w in works if not w.is_completed()}))
                raise _StepError(str(exc), silent) from exc

    def _reduce(self, step: Reduce) -> None:
        dist, me = self._dist, self._host
        works: list = []
        for peer, ranges in enumerate(step.owners):  # what each other host reduces
            if peer != me:
                for tag, span in enumerate(ranges):
                    works.append((peer, dist.isend(self._span(step.block, span), peer, tag=tag)))
        mine = step.owners[me]
        received: list[list[Any]] = []  # received[i][h]: host h's data for my range i
        for tag, span in enumerate(mine):
            per_host: list[Any] = []
            for peer in range(self._hosts):
                if peer == me:
                    per_host.append(None)
                    continue
                buffer = self._receive_buffer(tag, peer, span[1] - span[0])
                works.append((peer, dist.irecv(buffer, peer, tag=tag)))
                per_host.append(buffer)
            received.append(per_host)
        self._wait(works)
        dtype = collective_pieces.numpy_dtype(step.dtype)
        ufunc = collective_pieces.reduce_ufunc(step.op)
        with np.errstate(all="ignore"):  # overflow is the data's business, as on the device
            for span, per_host in zip(mine, received):
                out = self._span(step.block, span).numpy().view(dtype)
                own = out if me < 2 else out.copy()  # read after out is first written
                parts = [own if b is None else b.numpy().view(dtype) for b in per_host]
                ufunc(parts[0], parts[1], out=out)  # host 0 first, then 1, 2, ...
                for part in parts[2:]:
                    ufunc(out, part, out=out)

    def _exchange(self, block: int, sends: Sequence, recvs: Sequence) -> None:
        """Post every send and receive of a step at once; each peer's ranges are tagged in
        order, the same order its own step names them in."""
        dist, works = self._dist, []
        tags: dict[tuple[int, str], int] = {}
        for peer, span in sends:
            tag = tags[peer, "send"] = tags.get((peer, "send"), -1) + 1
            works.append((peer, dist.isend(self._span(block, span), peer, tag=tag)))
        for peer, span in recvs:
            tag = tags[peer, "recv"] = tags.get((peer, "recv"), -1) + 1
            works.append((peer, dist.irecv(self._span(block, span), peer, tag=tag)))
        self._wait(works)

    # ---- transfers: beside the steps ------------------------------------------------------------
    def _segment(self, name: str) -> Any:
        data = self._segments.get(name)
        if data is None:  # another device of this host
            region = self._regions[name] = Region.attach(name, device=True)
            data = self._segments[name] = _bytes_of(region)
            self._map_backing(self._backing, {name: region})
        return data

    def rebacked(self, changes: Rebacked) -> None:
        """Map page runs of the device windows from the files that back them now."""
        if changes.whole:
            self._backing.clear()
        self._backing += changes.changes
        self._map_backing(changes.changes, self._regions)

    @staticmethod
    def _map_backing(changes: Iterable[tuple[str, int, int, str]], regions: dict) -> None:
        for segment, offset, length, source in changes:
            region = regions.get(segment)
            if region is not None:
                window.map_source(region.address(), source, offset, length, offset)

    def start_transfer(self, step: Transfer) -> None:
        """Post a Transfer's header (and, sending, its data); a thread waits for the rest."""
        dist, peer = self._dist, step.peer
        header_tag = TRANSFER_TAGS + 2 * step.tag
        data = self._segment(step.segment)[step.span[0] : step.span[1]]
        header = _header(step.match + b"\0" + step.call)
        if step.sending:
            works = [
                (peer, dist.isend(header, peer, tag=header_tag)),
                (peer, dist.isend(data, peer, tag=header_tag + 1)),
            ]
            thread = threading.Thread(target=self._sent, args=(step, works), daemon=True)
        else:
            theirs = _header(b"")
            work = dist.irecv(theirs, peer, tag=header_tag)
            thread = threading.Thread(
                target=self._receive, args=(step, header, theirs, work, data), daemon=True
            )
        self._transfers.append(thread)
        thread.start()

    def _sent(self, step: Transfer, works: list) -> None:
        self._transfer_done(step, lambda: self._wait(works))

    def _receive(self, step: Transfer, header: Any, theirs: Any, work: Any, data: Any) -> None:
        def finish() -> None:
            self._wait([(step.peer, work)])
            mine_match, _, mine_call = _unpad(header).partition(b"\0")
            their_match, _, their_call = _unpad(theirs).partition(b"\0")
            if their_match != mine_match:
                calls = [b""] * self._hosts
                calls[self._host], calls[step.peer] = mine_call, their_call
                self._reports.last(Mismatch(step.seq, tuple(calls)))
            tag = TRANSFER_TAGS + 2 * step.tag + 1
            self._wait([(step.peer, self._dist.irecv(data, step.peer, tag=tag))])

        self._transfer_done(step, finish)

    def _transfer_done(self, step: Transfer, wait: Any) -> None:
        try:
            wait()
        except _StepError as error:
            self._reports.last(StepFailed(step.seq, str(error), error.silent))
        self._reports.send(StepDone(step.seq))


def _bytes_of(region: Region) -> Any:
    import torch

    return torch.from_numpy(np.frombuffer(region.map, np.uint8))


def _header(content: bytes) -> Any:
    """MATCH_BYTES of `content`, zero-padded, as a tensor to send or receive into."""
    import torch

    header = torch.zeros(MATCH_BYTES, dtype=torch.uint8)
    content = content[:MATCH_BYTES]
    if content:
        header[: len(content)] = torch.frombuffer(bytearray(content), dtype=torch.uint8)
    return header


def _unpad(header: Any) -> bytes:
    return bytes(header.numpy()).rstrip(b"\0")


def _form(setup: ExchangeSetup, reports: _Reports) -> None:
    """Join the world (blocks until every host's exchange process has, or the timeout)."""
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
        reports.send(StoreListening(store.port))
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
_IPV6_ADDRESSES = "/proc/net/if_inet6"  # each IPv6 address of this machine, and its interface


def interface_of(host: str) -> str | None:
    """The name of this machine's network interface that holds `host`'s address (IPv4 or
    IPv6), or None (not an address of this machine, or it does not resolve)."""
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        resolved = {str(info[4][0]) for info in found}
    except OSError:
        return None
    for address in sorted(resolved):
        name = _ipv6_interface(address) if ":" in address else _ipv4_interface(address)
        if name is not None:
            return name
    return None


def _ipv4_interface(address: str) -> str | None:
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


def _ipv6_interface(address: str) -> str | None:
    wanted = socket.inet_pton(socket.AF_INET6, address.split("%")[0]).hex()
    try:
        with open(_IPV6_ADDRESSES, encoding="ascii") as table:
            for line in table:
                fields = line.split()
                if len(fields) == 6 and fields[0] == wanted:
                    return fields[5]
    except OSError:  # no IPv6 on this machine
        pass
    return None


def main(conn: Connection, setup: ExchangeSetup) -> None:
    """Entry point of a spawned exchange process: form the world, then run steps until the
    pipe closes, a Finish, or a step fails."""
    end_with_daemon()
    reports = _Reports(conn)
    seq = -1
    try:
        try:
            region = Region.attach(setup.segment, device=True)
        except Exception as exc:  # noqa: BLE001 - named, then reported like any failure
            raise RuntimeError(f"cannot map device segment {setup.segment}: {exc}") from exc
        _form(setup, reports)
        reports.send(Formed())
        gloo = _Gloo(setup, region, reports)
        steps: queue.SimpleQueue = queue.SimpleQueue()
        runner = threading.Thread(target=gloo.run_steps, args=(steps,), daemon=True)
        runner.start()
        while True:  # a Transfer starts at once, even while a step waits for its peers
            try:
                step = conn.recv()
            except EOFError:
                return
            if isinstance(step, Finish):
                steps.put(None)
                runner.join()
                gloo.wait_for_transfers()
                return
            if isinstance(step, Rebacked):
                gloo.rebacked(step)
                continue
            seq = step.seq
            if isinstance(step, Transfer):
                gloo.start_transfer(step)
            else:
                steps.put(step)
    except Exception as exc:  # noqa: BLE001 - reported to the daemon, then the process ends
        reports.last(StepFailed(seq, _describe(exc)))


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
