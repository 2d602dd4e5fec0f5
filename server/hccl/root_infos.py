"""What a root info's bytes say, and a rank table's key within a tenant.

HcclGetRootInfo's 4108 bytes (ht.HCCL_ROOT_INFO_BYTES) carry the communicator id, the
issuing daemon's identity (pid and a random nonce), the communicator's random secret, the
root device and the daemon's advertised address, if it has one. The secret is what a rank
presents to join: communicator ids are small numbers, so without it a root info could be
made from any other one (docs/security.md, "Tenants").
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from dataclasses import dataclass

from simnpu.proto import hccl_types as ht
from simnpu.server.core.tenants import Tenant

ROOT_MAGIC = b"simnpu-hccl-root"
ROOT_VERSION = 3
ROOT_LAYOUT = struct.Struct(
    "<16sIQI16s16sIH"
)  # magic, version, comm id, daemon pid, daemon nonce, communicator secret, root device,
# address length; then the daemon's advertised address (UTF-8; empty: none)
SECRET_BYTES = 16


@dataclass(frozen=True)
class RootInfo:
    """What HcclGetRootInfo's bytes say (parse)."""

    comm_id: int
    pid: int
    nonce: bytes
    secret: bytes  # the communicator's: a root info cannot be made up from its id
    address: str  # the issuing daemon's advertised address ("" if none)


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def pack(info: RootInfo, device: int) -> bytes:
    """The bytes of `info` for a communicator rooted on `device`."""
    address = info.address.encode()
    head = ROOT_LAYOUT.pack(
        ROOT_MAGIC,
        ROOT_VERSION,
        info.comm_id,
        info.pid,
        info.nonce,
        info.secret,
        device,
        len(address),
    )
    return (head + address).ljust(ht.HCCL_ROOT_INFO_BYTES, b"\0")


def parse(data: bytes) -> RootInfo | str:
    """The fields of root info `data`, or why they are not a simnpu root info."""
    if len(data) != ht.HCCL_ROOT_INFO_BYTES or not data.startswith(ROOT_MAGIC):
        return (
            f"not a simnpu HCCL root info ({len(data)} bytes; "
            f"expected {ht.HCCL_ROOT_INFO_BYTES} from get_root_info)"
        )
    _, version, comm_id, pid, nonce, secret, _, length = ROOT_LAYOUT.unpack_from(data)
    if version != ROOT_VERSION:
        return f"a root info of simnpu's layout {version}, not {ROOT_VERSION}"
    try:
        address = data[ROOT_LAYOUT.size : ROOT_LAYOUT.size + length].decode()
    except UnicodeDecodeError:
        return "the root info's address is not UTF-8"
    return RootInfo(comm_id, pid, nonce, secret, address)


def tenant_table_key(table_key: bytes, tenant: Tenant) -> bytes:
    """A rank table's key (proto/rank_table.py) within `tenant`: ranks of different tenants
    that join with the same table form different communicators."""
    return hashlib.sha256(tenant.key.encode() + b"\0" + table_key).digest()
