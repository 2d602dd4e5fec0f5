"""HCCL rank tables (HcclCommInitClusterInfo): the JSON file naming every rank of a world,
the server it runs on and its device, in the format versions "1.0" and "1.2" (HCCL's
"concise" format; a table without a version, the older "standard" format, is not read).

    {"status": "completed", "version": "1.0", "server_count": "1",
     "server_list": [{"server_id": "node_0",
                      "device": [{"device_id": "0", "device_ip": "192.168.1.8", "rank_id": "0"},
                                 {"device_id": "1", "device_ip": "192.168.1.9", "rank_id": "1"}]}]}

Both sides parse it: the client to fail early and to wait while the table's status is not
"completed", the daemon because it trusts nobody. The checks and their HcclResults follow
HCCL's parser of that format: every value is a JSON string (else HCCL_E_PARA), a required
key that is missing is HCCL_E_NOT_FOUND, and the rank ids must be 0 .. n - 1. Keys HCCL
does not read are ignored, as HCCL ignores them. No grpc and no numpy here.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass

from simnpu.proto import hccl_types as ht
from simnpu.proto import service

VERSIONS = ("1.0", "1.2")
COMPLETED = "completed"
MAX_DEVICE_ID = 15  # HCCL's limit for the A2 / A3 chips simnpu models
MAX_SERVER_ID_CHARS = 127
MAX_TABLE_BYTES = 16 << 20


class RankTableError(Exception):
    """A rank table HCCL would refuse: `.result` is the HcclResult."""

    def __init__(self, result: int, message: str):
        super().__init__(message)
        self.result = result
        self.message = message


@dataclass(frozen=True)
class TableRank:
    """One rank of a rank table."""

    rank: int
    server_id: str
    server_index: int  # its server's place in server_list (HCCL's server order)
    device_id: int


@dataclass(frozen=True)
class RankTable:
    """A parsed rank table: its ranks by rank id, and a key that identifies its content."""

    status: str
    servers: tuple[str, ...]  # server ids, in server_list order
    ranks: tuple[TableRank, ...]  # ranks[i].rank == i
    key: bytes  # sha256 of the table's canonical JSON: the same table, the same world
    text: str  # the JSON document as given
    addresses: tuple[str, ...] = ()  # each server's "simnpu_address" ("" where none)

    def daemon_addresses(self, overrides: str) -> tuple[str, ...]:
        """Each server's daemon address: its "simnpu_address", unless `overrides`
        (SIMNPU_SERVER_ADDRESSES, "server_id=host:port,...") names it. RankTableError
        (HCCL_E_PARA) for a malformed override, an unknown server id or a server left
        without an address."""
        addresses = dict(zip(self.servers, self.addresses or ("",) * len(self.servers)))
        for item in filter(None, (part.strip() for part in overrides.split(","))):
            server_id, equals, address = item.partition("=")
            if not equals or server_id not in addresses or not service.is_tcp_address(address):
                raise RankTableError(
                    ht.HCCL_E_PARA,
                    f"SIMNPU_SERVER_ADDRESSES entry {item!r} is not server_id=host:port of a "
                    f"server of the table ({', '.join(self.servers)})",
                )
            addresses[server_id] = address
        missing = [server for server, address in addresses.items() if not address]
        if missing:
            raise RankTableError(
                ht.HCCL_E_PARA,
                f"no daemon address for server {', '.join(missing)}: give each server of the "
                'table a "simnpu_address", or set SIMNPU_SERVER_ADDRESSES (docs/multihost.md)',
            )
        return tuple(addresses[server] for server in self.servers)

    @property
    def completed(self) -> bool:
        return self.status == COMPLETED

    def entry(self, rank: int, device: int) -> TableRank:
        """The table's entry for `rank`, checked against the caller's current `device`:
        a rank outside the table is HCCL_E_PARA, another device than the entry's is
        HCCL_E_UNAVAIL (HCCL compares the current device's physical id)."""
        if not 0 <= rank < len(self.ranks):
            raise RankTableError(
                ht.HCCL_E_PARA, f"rank {rank} is not in the rank table's 0 .. {len(self.ranks) - 1}"
            )
        entry = self.ranks[rank]
        if entry.device_id != device:
            raise RankTableError(
                ht.HCCL_E_UNAVAIL,
                f"rank {rank} is on device {entry.device_id} of server {entry.server_id!r} in "
                f"the rank table, but this thread's current device is {device}",
            )
        return entry


def parse(text: str) -> RankTable:
    """The rank table in `text` (a JSON document). RankTableError saying what is wrong."""
    if len(text) > MAX_TABLE_BYTES:
        raise RankTableError(
            ht.HCCL_E_PARA, f"the rank table has {len(text)} bytes, more than {MAX_TABLE_BYTES}"
        )
    try:
        document = json.loads(text)
    except ValueError as error:
        raise RankTableError(ht.HCCL_E_INTERNAL, f"the rank table is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise RankTableError(ht.HCCL_E_PARA, "the rank table is not a JSON object")
    if "version" not in document:
        raise RankTableError(
            ht.HCCL_E_NOT_SUPPORT,
            "the rank table has no version (HCCL's older standard format): simnpu reads "
            f"versions {', '.join(VERSIONS)}",
        )
    version = _string(document, "version", "the rank table")
    if version not in VERSIONS:
        raise RankTableError(
            ht.HCCL_E_NOT_SUPPORT,
            f"rank table version {version!r} is not supported: use one of {', '.join(VERSIONS)}",
        )
    status = _string(document, "status", "the rank table")
    servers = document.get("server_list")
    if servers is None:
        raise RankTableError(ht.HCCL_E_NOT_FOUND, "the rank table has no server_list")
    if not isinstance(servers, list) or not servers:
        raise RankTableError(ht.HCCL_E_PARA, "the rank table's server_list is empty or no list")
    if "server_count" in document:
        count = _number(document, "server_count", "the rank table")
        if count != len(servers):
            raise RankTableError(
                ht.HCCL_E_PARA,
                f"server_count is {count} but server_list holds {len(servers)} servers",
            )
    server_ids: list[str] = []
    server_addresses: list[str] = []
    ranks: list[TableRank] = []
    device_ips: dict[str, str] = {}  # address -> where it was seen
    ip_counts: set[int] = set()
    for index, server in enumerate(servers):
        where = f"server_list[{index}]"
        if not isinstance(server, dict):
            raise RankTableError(ht.HCCL_E_PARA, f"{where} is not a JSON object")
        server_id = _string(server, "server_id", where)
        if not server_id or len(server_id) > MAX_SERVER_ID_CHARS:
            raise RankTableError(
                ht.HCCL_E_PARA, f"{where}'s server_id is empty or over {MAX_SERVER_ID_CHARS} chars"
            )
        if server_id in server_ids:
            raise RankTableError(ht.HCCL_E_PARA, f"server_id {server_id!r} appears twice")
        server_ids.append(server_id)
        address = _string(server, "simnpu_address", where) if "simnpu_address" in server else ""
        if "simnpu_address" in server and not service.is_tcp_address(address):
            raise RankTableError(
                ht.HCCL_E_PARA, f"{where}'s simnpu_address {address!r} is not host:port"
            )
        server_addresses.append(address)
        has_host_ip = "host_ip" in server
        if has_host_ip:
            _addresses(_string(server, "host_ip", where), f"{where}'s host_ip")
        devices = server.get("device")
        if devices is None:
            raise RankTableError(ht.HCCL_E_NOT_FOUND, f"{where} has no device list")
        if not isinstance(devices, list) or not devices:
            raise RankTableError(ht.HCCL_E_PARA, f"{where}'s device list is empty or no list")
        for slot, device in enumerate(devices):
            at = f"{where}.device[{slot}]"
            if not isinstance(device, dict):
                raise RankTableError(ht.HCCL_E_PARA, f"{at} is not a JSON object")
            rank = _number(device, "rank_id", at)
            device_id = _number(device, "device_id", at)
            if device_id > MAX_DEVICE_ID:
                raise RankTableError(
                    ht.HCCL_E_PARA, f"{at}'s device_id {device_id} is over {MAX_DEVICE_ID}"
                )
            if "device_ip" in device:
                addresses = _addresses(_string(device, "device_ip", at), f"{at}'s device_ip")
                ip_counts.add(len(addresses))
                for address in addresses:
                    if address in device_ips:
                        raise RankTableError(
                            ht.HCCL_E_PARA,
                            f"device_ip {address} of {at} is also {device_ips[address]}'s",
                        )
                    device_ips[address] = at
            elif len(servers) > 1 and not has_host_ip:
                raise RankTableError(
                    ht.HCCL_E_NOT_FOUND,
                    f"{at} has no device_ip (a table of several servers needs it, or the "
                    "server's host_ip)",
                )
            ranks.append(TableRank(rank, server_id, index, device_id))
    if len(ip_counts) > 1:
        raise RankTableError(ht.HCCL_E_PARA, "the devices list different numbers of device_ip")
    if len(ranks) > ht.MAX_RANKS:
        raise RankTableError(
            ht.HCCL_E_PARA, f"the rank table has {len(ranks)} ranks, more than {ht.MAX_RANKS}"
        )
    ranks.sort(key=lambda entry: entry.rank)
    for expected, entry in enumerate(ranks):
        if entry.rank != expected:
            raise RankTableError(
                ht.HCCL_E_PARA,
                f"the rank ids are not 0 .. {len(ranks) - 1}, each once: "
                f"{sorted(r.rank for r in ranks)}",
            )
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    key = hashlib.sha256(canonical.encode()).digest()
    return RankTable(status, tuple(server_ids), tuple(ranks), key, text, tuple(server_addresses))


def _string(node: dict, name: str, where: str) -> str:
    if name not in node:
        raise RankTableError(ht.HCCL_E_NOT_FOUND, f"{where} has no {name}")
    value = node[name]
    if not isinstance(value, str):
        raise RankTableError(
            ht.HCCL_E_PARA, f"{where}'s {name} is {json.dumps(value)}, not a JSON string"
        )
    return value


def _number(node: dict, name: str, where: str) -> int:
    text = _string(node, name, where)
    if not text.isascii() or not text.isdecimal() or len(text) > 9:
        raise RankTableError(ht.HCCL_E_PARA, f"{where}'s {name} {text!r} is not a decimal number")
    return int(text)


def _addresses(text: str, what: str) -> list[str]:
    addresses = [part.strip() for part in text.split(",")]
    for address in addresses:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise RankTableError(
                ht.HCCL_E_PARA, f"{what} {address!r} is not an IP address"
            ) from None
    return addresses
