"""The tools' one call to a running daemon: its read-only Query RPC (no session, no daemon
is ever started), and the one-line messages of a tool that cannot reach it."""

from __future__ import annotations

import json
import os

from simnpu.client import autostart, config, peer_credentials

config.prefer_fast_grpc()

import grpc  # noqa: E402

from simnpu.proto import npu_pb2, service  # noqa: E402
from simnpu.proto.errors import NpuError  # noqa: E402


class ToolError(Exception):
    """What a tool prints, one line, before it exits with status 1."""


def daemon_address(address: str | None = None) -> str:
    """The daemon's address: `address` (a tool's --address), else SIMNPU_ADDRESS, else the
    per-user socket. ToolError if it is not an address."""
    try:
        if address:
            config.parse(address, "--address")
            return address
        return config.address()
    except NpuError as error:
        raise ToolError(error.message) from None


def no_daemon(address: str) -> str:
    """Why a tool finds no daemon at `address`, and what to do."""
    listen = "" if address == config.default_address() else f" --listen {address}"
    return (
        f"no simnpu daemon at {address}: a daemon that a program started by itself "
        "exits 5 s after its last client (SIMNPU_IDLE_EXIT seconds), and tools never start "
        f"one: run `simnpu serve{listen}` in another terminal first, or run the program with "
        "SIMNPU_IDLE_EXIT=600 to keep its daemon for 10 minutes"
    )


def rpc_failure(error: grpc.RpcError, address: str, timeout: float) -> str:
    """One line for a failed call to the daemon at `address`: what failed, and a hint."""
    code = error.code()
    details = (error.details() or "").split("\n")[0]
    if code == grpc.StatusCode.UNAVAILABLE:
        path = service.parse_address(address).path
        if path is not None and not os.path.exists(path):
            return no_daemon(address) + f" (no socket file {path})"
        refused = "connection refused" in details.lower()
        return no_daemon(address) + (" (connection refused)" if refused else f" ({details})")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the simnpu daemon at {address} did not answer within {timeout:g} s"
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return (
            f"the simnpu daemon at {address} refused this client ({details}): set the token "
            "it wants in SIMNPU_TOKEN or SIMNPU_TOKEN_FILE"
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"the server at {address} is not a simnpu daemon ({details})"
    return f"the call to the simnpu daemon at {address} failed: {code.name}: {details}"


def query(what: str, device: int = 0, address: str | None = None, token: str | None = None):
    """The daemon's answer to Query(what, device), decoded from JSON. ToolError if there is
    no daemon or it does not answer."""
    address = daemon_address(address)
    if not autostart.reachable(address):
        raise ToolError(no_daemon(address))
    if token is None:
        try:
            token = config.token()
        except (OSError, ValueError) as error:  # SIMNPU_TOKEN_FILE: unreadable, malformed
            raise ToolError(f"SIMNPU_TOKEN_FILE: {error}") from None
    metadata = [(service.TOKEN_METADATA_KEY, token)] if token else []
    metadata += peer_credentials.ask(address)[1]  # on a Unix socket: who it is (its tenant)
    with grpc.insecure_channel(address, options=service.CLIENT_CHANNEL_OPTIONS) as channel:
        call = channel.unary_unary(
            service.QUERY_METHOD,
            request_serializer=npu_pb2.QueryRequest.SerializeToString,
            response_deserializer=npu_pb2.QueryReply.FromString,
        )
        try:
            reply = call(
                npu_pb2.QueryRequest(what=what, device=device), metadata=metadata, timeout=30
            )
        except grpc.RpcError as error:
            raise ToolError(rpc_failure(error, address, 30)) from None
    answer = json.loads(reply.json)
    if isinstance(answer, dict) and "error" in answer:
        raise ToolError(answer["error"])
    return answer
