"""The tools' one call to a running daemon: its read-only Query RPC (no session, no daemon
is ever started)."""

from __future__ import annotations

import json

from simnpu.client import autostart, config

config.prefer_fast_grpc()

import grpc  # noqa: E402

from simnpu.proto import npu_pb2, service  # noqa: E402


class ToolError(Exception):
    pass


def query(what: str, device: int = 0, address: str | None = None, token: str | None = None):
    """The daemon's answer to Query(what, device), decoded from JSON."""
    address = address or config.address()
    if not autostart.reachable(address):
        raise ToolError(
            f"no simnpu daemon at {address} (start one with `simnpu serve`, or set SIMNPU_ADDRESS)"
        )
    token = token if token is not None else config.token()
    metadata = [(service.TOKEN_METADATA_KEY, token)] if token else None
    with grpc.insecure_channel(address, options=service.CHANNEL_OPTIONS) as channel:
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
            raise ToolError(f"the simnpu daemon at {address}: {error.details()}") from None
    answer = json.loads(reply.json)
    if isinstance(answer, dict) and "error" in answer:
        raise ToolError(answer["error"])
    return answer
