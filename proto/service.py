"""Names and limits of the gRPC service that both sides must agree on (no grpc import here)."""

import os

SERVICE = "simnpu.v1.Npu"
SESSION_METHOD = f"/{SERVICE}/Session"
QUERY_METHOD = f"/{SERVICE}/Query"
TOKEN_METADATA_KEY = "simnpu-token"

MAX_MESSAGE_BYTES = 256 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def default_address() -> str:
    """unix://$XDG_RUNTIME_DIR/simnpu.sock, else unix:///tmp/simnpu-<uid>/simnpu.sock."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    base = runtime_dir if runtime_dir else f"/tmp/simnpu-{os.getuid()}"
    return f"unix://{base}/simnpu.sock"


def configured_address() -> str:
    """Where clients look for the daemon, and where it listens by default: SIMNPU_ADDRESS,
    else the per-user Unix socket."""
    return os.environ.get("SIMNPU_ADDRESS") or default_address()


def prefer_fast_grpc() -> None:
    """Use grpcio's classic polling engine unless the user chose otherwise.

    On this kind of machine it cuts a Unix-socket round trip by about a third. It is an
    experimental grpcio setting that may disappear: set GRPC_EXPERIMENTS (even to "")
    to override it. Must run before grpc is first imported in the process.
    """
    os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client,-event_engine_listener")
