"""Finding the kernels of a client's module (aclrtBinaryLoadFromFile / FromData) where the
parse cannot hurt anyone else.

Parsing Python source costs about 3 µs of CPU and 250-700 bytes of memory per byte of
source, in C code that holds the GIL all along: parsed in the daemon, one 16 MB module held
every other client's threads for seconds and grew the daemon by gigabytes. So the source is
bounded first (`simnpu serve --max-module-size`, 1 MiB by default), then parsed by a child
process of its own (server/kernels/parse_main.py), which caps its address space and CPU
time before it reads the source and prints the kernels it found as JSON. The
session's thread waits for it without the GIL or any lock. How many parses run at once, and
whose, is server/control/module_loads.py's to decide. Whatever stops the parse
-- a syntax error, a module nested too deeply (RecursionError, or the parser's MemoryError),
the memory or CPU cap -- is ACL_ERROR_INVALID_FILE. A parser killed from outside (SIGKILL:
the CPU cap sends SIGXCPU) says nothing of the module: ACL_ERROR_RT_INTERNAL_ERROR.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Callable

from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.proto.kernel_abi import KernelSignature

PARSE_MEMORY_BASE = 256 << 20  # the parser's address space: this, plus ...
PARSE_MEMORY_PER_BYTE = 512  # ... this much per byte of the largest module accepted
PARSE_CPU_BASE_S = 10  # its CPU time: this, plus ...
PARSE_CPU_PER_BYTE_S = 30e-6  # ... this much per byte of the largest module accepted

SMALL_MODULE = 64 << 10
"""A module of more bytes is parsed at LARGE_PARSE_NICE: beside it, a small one's parse
(mostly the parser's start) gets the CPU first."""
LARGE_PARSE_NICE = 10

PARSE_MAIN = "simnpu.server.kernels.parse_main"  # the child that parses (never imported here)

log = logging.getLogger("simnpu.kernels")
PARSER_WORDS = 1000  # characters of what a failed parser said that are logged


def module_size(source: str, filename: str, max_bytes: int) -> int:
    """The bytes of a module's source; NpuError(100003) if it is more than `max_bytes`."""
    size = len(source.encode())
    if size > max_bytes:
        raise _invalid_file(
            filename,
            f"its {size:,} bytes of source are more than the {max_bytes:,} this daemon "
            "accepts (simnpu serve --max-module-size)",
        )
    return size


def discover(
    source: str,
    filename: str,
    max_bytes: int,
    warn: Callable[..., object] = log.warning,
) -> dict[str, KernelSignature]:
    """The kernels of a module (`discover_kernels`), parsed in a bounded child process.
    Blocks the calling thread (not the GIL) until the parse ends; NpuError(100003) if the
    module is larger than `max_bytes` or cannot be parsed. What a parser that failed said
    goes to `warn(format, *args)` (a client's rate-limited log, from the session)."""
    size = module_size(source, filename, max_bytes)
    memory = PARSE_MEMORY_BASE + PARSE_MEMORY_PER_BYTE * max_bytes
    cpu_s = PARSE_CPU_BASE_S + round(PARSE_CPU_PER_BYTE_S * max_bytes)
    nice = LARGE_PARSE_NICE if size > SMALL_MODULE else 0
    child = subprocess.run(
        [sys.executable, "-P", "-m", PARSE_MAIN, str(memory), str(cpu_s), str(nice)],
        input=json.dumps([filename, source]).encode(),
        capture_output=True,
        check=False,
    )
    try:
        found = json.loads(child.stdout)
    except ValueError:
        if child.stderr:
            words = child.stderr.decode(errors="replace")
            if len(words) > PARSER_WORDS:
                words = f"...{words[-PARSER_WORDS:]}"  # its last words say why
            warn("the parser of kernel module %r: %r", filename, words)  # (repr: one line)
        if child.returncode == -signal.SIGKILL:
            raise NpuError(
                codes.ACL_ERROR_RT_INTERNAL_ERROR,
                f"cannot load kernel module {filename}: its parser was killed from outside "
                "the daemon; load it again",
            ) from None
        said = child.stderr.decode(errors="replace").strip().splitlines()
        last_words = f" ({said[-1][:200]})" if said else ""
        raise _invalid_file(
            filename, f"the parser {_ending(child.returncode)}{last_words}"
        ) from None
    if "error" in found:
        raise _invalid_file(filename, found["error"])
    return {name: KernelSignature.from_wire(types) for name, types in found["kernels"].items()}


def _invalid_file(filename: str, why: str) -> NpuError:
    return NpuError(codes.ACL_ERROR_INVALID_FILE, f"cannot load kernel module {filename}: {why}")


def _ending(returncode: int) -> str:
    if returncode == -signal.SIGXCPU:
        return "ran out of CPU time"
    if returncode < 0:
        return f"died with signal {-returncode}"
    return f"exited with code {returncode} without an answer"
