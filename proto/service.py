"""What both sides of the gRPC service agree on: its names, its limits, the addresses they
understand and where a daemon listens when nobody says otherwise, and how a shared token
is stored (no grpc import here)."""

from typing import NamedTuple

SERVICE = "simnpu.v1.Npu"
SESSION_METHOD = f"/{SERVICE}/Session"
QUERY_METHOD = f"/{SERVICE}/Query"
TOKEN_METADATA_KEY = "simnpu-token"

MAX_MESSAGE_BYTES = 256 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# A client's channels: CHANNEL_OPTIONS, and connections of their own. gRPC otherwise shares
# one connection per address and channel options across the process, with its state: a
# channel still backing off after nobody listened at an address made every new channel's
# calls to that address fail at once (UNAVAILABLE, "Connection refused"), even once a
# daemon listened there.
CLIENT_CHANNEL_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
# grpcio's classic polling engine: on a 2-vCPU machine it cuts a Unix-socket round trip by
# about a third. An experimental grpcio setting that may disappear; each side sets it as
# GRPC_EXPERIMENTS' default, so a user's own GRPC_EXPERIMENTS (even "") wins.
FAST_GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


# The gRPC addresses simnpu understands (what parse_address accepts), for error messages.
ADDRESS_FORMS = "unix:///abs/path.sock, unix:relative/path.sock, host:port or [v6]:port"


class Address(NamedTuple):
    """The parts of a gRPC address: a Unix socket's path, or a TCP host and port."""

    path: str | None  # the Unix socket's path as written (relative to the working directory)
    host: str  # TCP: the host name or IP address, without brackets ("" for a Unix socket)
    port: int  # TCP: the port (0 for a Unix socket)


def parse_address(address: str) -> Address:
    """The parts of `address`, one of ADDRESS_FORMS; ValueError saying what is wrong."""
    if address.startswith("unix:"):
        if address.startswith("unix://"):
            path = address[len("unix://") :]
            if not path.startswith("/"):
                raise ValueError("after unix:// comes an absolute path (three slashes: unix:///)")
        else:
            path = address[len("unix:") :]
        if not path.strip("/"):
            raise ValueError("the socket path is empty")
        return Address(path, "", 0)
    if "/" in address:
        raise ValueError(
            f"a Unix socket path needs the prefix unix: (unix://{address})"
            if address.startswith("/")
            else f"a Unix socket path needs the prefix unix: (unix:{address})"
        )
    host, colon, port = address.rpartition(":")
    if not colon:
        raise ValueError("no port: a TCP address is host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("an IPv6 address goes in brackets: [v6]:port")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the port {port!r} is not a number from 1 to 65535")
    return Address(None, host, int(port))


def default_address(runtime_dir: str | None, uid: int) -> str:
    """Where the daemon listens, and clients look, when nobody says otherwise: the user's
    runtime directory ($XDG_RUNTIME_DIR) if it has one, else /tmp/simnpu-<uid>."""
    base = runtime_dir if runtime_dir else f"/tmp/simnpu-{uid}"
    return f"unix://{base}/simnpu.sock"


OPERATOR_NAME = "operator"  # the name of a token file's first entry when it gives none
MAX_TENANT_NAME = 64


def token_entries(text: str) -> list[tuple[str, str]]:
    """The (name, token) entries of a token file's text, one per line: `TOKEN`, or
    `NAME TOKEN` (blank lines and lines starting with # are skipped). The first entry is the
    operator's (named OPERATOR_NAME unless it names itself); every later one is a tenant's
    and must be named (docs/security.md). ValueError, naming the line, for a line of more
    than two words, a later entry without a name, a name that is not printable or is longer
    than MAX_TENANT_NAME, or a name or token given twice."""
    entries: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) > 2:
            raise ValueError(f"line {number}: expected TOKEN or NAME TOKEN, not {len(words)} words")
        if len(words) == 1 and entries:
            raise ValueError(f"line {number}: a tenant's entry needs a name: NAME TOKEN")
        name, token = (OPERATOR_NAME, words[0]) if len(words) == 1 else (words[0], words[1])
        if len(name) > MAX_TENANT_NAME or not name.isprintable():
            raise ValueError(f"line {number}: a name is 1..{MAX_TENANT_NAME} printable characters")
        if any(name == n for n, _ in entries):
            raise ValueError(f"line {number}: the name {name!r} is given twice")
        if any(token == t for _, t in entries):
            raise ValueError(f"line {number}: this token is given twice")
        entries.append((name, token))
    return entries


def read_token_entries(path: str) -> list[tuple[str, str]]:
    """The entries of the token file at `path` (token_entries); OSError if it cannot be
    read, ValueError if it is malformed."""
    with open(path, encoding="utf-8") as handle:
        return token_entries(handle.read())


def read_token_file(path: str) -> str:
    """The token a client sends from the token file at `path`: its first entry's ("" if it
    has none); OSError if unreadable, ValueError if malformed."""
    entries = read_token_entries(path)
    return entries[0][1] if entries else ""


def is_tcp_address(address: str) -> bool:
    """True for a HOST:PORT address (one of parse_address's TCP forms)."""
    try:
        return parse_address(address).path is None
    except ValueError:
        return False
