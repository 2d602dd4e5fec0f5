"""Text a client chose (its process name, call sites, kernel names, the messages built from
them), made safe to write into the daemon's log: nothing it contains can end a log line
and start a forged one, or drive the terminal the log is read in; and the most of each such
string the daemon keeps or refuses past (docs/client-bounds.md)."""

from __future__ import annotations

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

# ---- the bounds: cut (kept for display) ----------------------------------------------------------
PROCESS_NAME = 128
"""Characters of a client's process name (HelloRequest.process_name) kept, for smi, the
timeline and log lines; a longer one is cut and ends with an ellipsis."""
CALL_SITE = 512
"""Characters of one call site (file:line) an observed client reports that are kept."""
LOG_LINE = 2000
"""Characters of one log line about a client (server/core/rate_limits.py, ClientLog)."""
QUOTED = 80
"""Characters of a refused string quoted back in an error message."""

# ---- the bounds: refused (ACL_ERROR_INVALID_PARAM) ----------------------------------------------
MODULE_FILENAME = 4096
"""Characters of a kernel module's file name (aclrtBinaryLoadFromFile: PATH_MAX)."""
KERNEL_NAME = 1024
"""Characters of a kernel's name looked up (aclrtBinaryGetFunction)."""
IPC_KEY = codes.ACL_IPC_MEM_KEY_LENGTH - 1
"""Characters of an IPC memory or notify key presented: 64, ACL's key buffer less its NUL
(aclrtIpcMemImportByKey, aclrtNotifyImportByKey; the clients check it too)."""
MODEL_NAME = 1024
"""Characters of a model run instance's name (aclmdlRISetName)."""

# ---- the bounds: refused (HCCL_E_PARA) ----------------------------------------------------------
RANK_TABLE = 4 << 20
"""Characters of a rank table (HcclCommInitClusterInfo; 4,096 ranks take about 0.5 MB)."""
SERVER_ADDRESSES = 64 << 10
"""Characters of a rank's SIMNPU_SERVER_ADDRESSES."""
JOB_SEED = 1024
"""Characters of a rank's SIMNPU_JOB_SEED (host:port). A job's name has its own bound
(server/hccl/job_rendezvous.py, MAX_JOB_NAME: 256)."""


def escaped(text: object) -> str:
    """`text` with every unprintable character (newline, carriage return, escape, other
    control and separator characters) written as its Python escape (\\n, \\x1b, \\u2028);
    printable text is returned unchanged."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit - 1` characters and an ellipsis when it is longer than
    `limit` characters."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "\u2026"


def quoted(text: str) -> str:
    """`text` as an error message quotes it: repr, cut to QUOTED characters and the length
    said when it was cut."""
    if len(text) <= QUOTED:
        return repr(text)
    return f"{text[:QUOTED]!r}... ({len(text):,} characters)"


def check_length(text: str, limit: int, what: str) -> str:
    """`text` if it has at most `limit` characters; else NpuError 100000
    (ACL_ERROR_INVALID_PARAM) naming `what` and the limit, quoting only its start."""
    if len(text) > limit:
        raise NpuError(
            codes.ACL_ERROR_INVALID_PARAM,
            f"{what} {quoted(text)} is longer than the {limit:,} characters this daemon takes",
        )
    return text
