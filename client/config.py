"""What the client reads from its environment: where the daemon is, the token it wants,
and how grpc should run in this process."""

from __future__ import annotations

import os

from simnpu.proto import codes, service
from simnpu.proto.errors import NpuError


def address() -> str:
    """Where the daemon is: SIMNPU_ADDRESS, else the per-user Unix socket. NpuError
    (ACL_ERROR_RT_NO_DEVICE) if SIMNPU_ADDRESS is not an address."""
    value = os.environ.get("SIMNPU_ADDRESS")
    if not value:
        return default_address()
    parse(value, "SIMNPU_ADDRESS")
    return value


def default_address() -> str:
    """The per-user Unix socket, where a daemon is started when none answers."""
    return service.default_address(os.environ.get("XDG_RUNTIME_DIR"), os.getuid())


def parse(address: str, source: str = "address") -> service.Address:
    """The parts of `address` (service.parse_address). NpuError (ACL_ERROR_RT_NO_DEVICE, the
    code of every failure to reach a daemon) naming `source` if it is not an address."""
    try:
        return service.parse_address(address)
    except ValueError as error:
        raise NpuError(
            codes.ACL_ERROR_RT_NO_DEVICE,
            f"{source}={address!r} is not a simnpu address: {error}; "
            f"the accepted forms are {service.ADDRESS_FORMS}",
        ) from None


def token() -> str | None:
    """The token a TCP listener wants: SIMNPU_TOKEN, else what the file SIMNPU_TOKEN_FILE
    holds (its first entry: e.g. a compose secret); None if neither is set. OSError if the
    file is unreadable, ValueError if it is malformed."""
    value = os.environ.get("SIMNPU_TOKEN")
    if value:
        return value
    path = os.environ.get("SIMNPU_TOKEN_FILE")
    return service.read_token_file(path) if path else None


def prefer_fast_grpc() -> None:
    """Use grpcio's classic polling engine unless the user chose otherwise (GRPC_EXPERIMENTS,
    even ""): on a small machine it cuts a Unix-socket round trip by about a third. Must run
    before grpc is first imported in the process."""
    os.environ.setdefault("GRPC_EXPERIMENTS", service.FAST_GRPC_EXPERIMENTS)
