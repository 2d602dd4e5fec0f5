"""What both sides of the gRPC service agree on: its names, its limits, where a daemon
listens when nobody says otherwise, and how a shared token is stored (no grpc import here)."""

SERVICE = "simnpu.v1.Npu"
SESSION_METHOD = f"/{SERVICE}/Session"
QUERY_METHOD = f"/{SERVICE}/Query"
TOKEN_METADATA_KEY = "simnpu-token"

MAX_MESSAGE_BYTES = 256 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# grpcio's classic polling engine: on a 2-vCPU machine it cuts a Unix-socket round trip by
# about a third. An experimental grpcio setting that may disappear; each side sets it as
# GRPC_EXPERIMENTS' default, so a user's own GRPC_EXPERIMENTS (even "") wins.
FAST_GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def default_address(runtime_dir: str | None, uid: int) -> str:
    """Where the daemon listens, and clients look, when nobody says otherwise: the user's
    runtime directory ($XDG_RUNTIME_DIR) if it has one, else /tmp/simnpu-<uid>."""
    base = runtime_dir if runtime_dir else f"/tmp/simnpu-{uid}"
    return f"unix://{base}/simnpu.sock"


def read_token_file(path: str) -> str:
    """The token a token file holds (surrounding white space stripped); OSError if unreadable."""
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()
