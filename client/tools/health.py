"""`simnpu health`: ask a daemon's standard gRPC health service whether it is serving.

Exit status 0 when grpc.health.v1.Health/Check answers SERVING, 1 otherwise (one line
says what failed and what to do), so it serves as a container healthcheck (the
Dockerfile's HEALTHCHECK) or a readiness probe in a script. One unary call: no session is
opened, nothing is allocated, no daemon is started. The health service needs no token;
one configured for the client (SIMNPU_TOKEN or SIMNPU_TOKEN_FILE) is sent anyway, so a
proxy that checks it lets the call through.
"""

from __future__ import annotations

import argparse
import sys

from simnpu.client import config
from simnpu.client.tools.query import ToolError, daemon_address, rpc_failure
from simnpu.proto import service

config.prefer_fast_grpc()

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402


def check(address: str, what: str = service.SERVICE, timeout: float = 5.0) -> str:
    """The serving status of `what` at the daemon at `address`: "SERVING", "NOT_SERVING",
    ..., or "UNREACHABLE: <what failed, and a hint>" (one line). Blocks up to `timeout`."""
    try:
        token = config.token()
    except (OSError, ValueError):
        token = None  # the health service does not need it
    metadata = [(service.TOKEN_METADATA_KEY, token)] if token else None
    with grpc.insecure_channel(address, options=service.CLIENT_CHANNEL_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=what), timeout=timeout, metadata=metadata
            )
        except grpc.RpcError as error:
            return f"UNREACHABLE: {rpc_failure(error, address, timeout)}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="simnpu health", description="exit 0 if the simnpu daemon is serving"
    )
    parser.add_argument(
        "--address",
        help="the daemon's gRPC address (default $SIMNPU_ADDRESS, else the per-user Unix socket)",
    )
    parser.add_argument(
        "--service",
        default=service.SERVICE,
        help=f"the service name to check (default {service.SERVICE}; '' = the server)",
    )
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    args = parser.parse_args(argv)
    try:
        address = daemon_address(args.address)
    except ToolError as error:
        if not args.quiet:
            print(f"simnpu: {error}", file=sys.stderr)
        return 1
    status = check(address, args.service, args.timeout)
    if not args.quiet:
        print(f"{address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
