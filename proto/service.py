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


def configured_token() -> str | None:
    """The shared token of TCP listeners, for the daemon and its clients alike:
    SIMNPU_TOKEN, else what the file SIMNPU_TOKEN_FILE names holds (e.g. a compose
    secret); None if neither is set. Unix sockets need no token."""
    token = os.environ.get("SIMNPU_TOKEN")
    if token:
        return token
    path = os.environ.get("SIMNPU_TOKEN_FILE")
    return read_token_file(path) if path else None


def read_token_file(path: str) -> str:
    """The token a file holds (surrounding white space stripped); OSError if unreadable."""
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


def prefer_fast_grpc() -> None:
    """Use grpcio's classic polling engine unless the user chose otherwise.

    On this kind of machine it cuts a Unix-socket round trip by about a third. It is an
    experimental grpcio setting that may disappear: set GRPC_EXPERIMENTS (even to "")
    to override it. Must run before grpc is first imported in the process.
    """
    os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client,-event_engine_listener")
