"""The child process that parses a client's kernel module for the daemon
(server/kernels/discovery.py): it caps its own address space and CPU time, reads
[filename, source] from stdin and prints the kernels it found, or why it found none, as JSON.
Run as `python -P -m simnpu.server.kernels.parse_main MEMORY CPU_SECONDS [NICE]`.
"""

from __future__ import annotations

import json
import os
import resource
import sys

from simnpu.proto.kernel_abi import discover_kernels


def main(argv: list[str]) -> None:
    """The child: cap this process (`argv`: bytes of address space, seconds of CPU, and how
    much nicer than the daemon it runs, if given), read
    [filename, source] from stdin, print {"kernels": {name: types}} or {"error": why}, all
    as JSON."""
    memory, cpu_s = int(argv[0]), int(argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    if len(argv) > 2:
        os.nice(int(argv[2]))
    filename, source = json.load(sys.stdin)
    try:
        kernels = discover_kernels(source, filename)
        answer: dict = {"kernels": {name: sig.to_wire() for name, sig in kernels.items()}}
    except (SyntaxError, ValueError) as error:
        answer = {"error": str(error)}
    except RecursionError:
        answer = {"error": "it is nested too deeply to parse (RecursionError)"}
    except MemoryError:
        answer = {
            "error": "it is nested too deeply or too large to parse (MemoryError; the parse "
            f"may use {memory >> 20} MiB)"
        }
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
