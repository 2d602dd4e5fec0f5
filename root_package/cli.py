"""The `simnpu` command: `simnpu serve` runs the daemon, the other commands are tools that
talk to a running daemon.

This module sits above both sides and imports neither until it knows which one is meant:
`serve` goes to simnpu.server.control.cli (the daemon), the tools to simnpu.client.tools (clients
of the daemon's Query RPC). So the tools never load the daemon's code, and the
daemon's package never imports the client's (see docs/memory.md, "On the command line").
"""

from __future__ import annotations

import sys

TOOLS = ("memory",)
USAGE = """usage: simnpu COMMAND ...
       simnpu --version

commands:
  serve                 run the device daemon (simnpu serve --help)
  memory stats          device-memory statistics of a running daemon (--device N, --json)
  memory snapshot       its live blocks with their owners (--device N, --json)
  health                exit 0 if the daemon is serving (gRPC health check; --address)
  smi                   devices, AI-core use, memory and processes, like npu-smi info \
(--watch, --json)
  trace summary FILE    per-stream busy time, overlap and longest gaps of a trace (SIMNPU_TRACE)
  trace save FILE       a running daemon's timeline (simnpu serve --trace) as Perfetto JSON
  check report          a running daemon's checker findings (simnpu serve --check)
"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    if command in ("-V", "--version"):
        from importlib.metadata import version

        print(f"simnpu {version('simnpu')}")
        return 0
    if command == "serve":
        from simnpu.server.control.cli import main as serve

        return serve(argv)
    if command == "health":
        from simnpu.client.tools.health import main as health

        return health(argv[1:])
    if command == "smi":
        from simnpu.client.tools.smi import main as smi

        return smi(argv[1:])
    if command in ("trace", "check"):
        from simnpu.client.tools.trace_command import main as observe_tool

        return observe_tool(argv)
    if command in TOOLS:
        from simnpu.client.tools.memory_command import main as tool

        return tool(argv)
    print(USAGE, file=sys.stdout if command in ("-h", "--help") else sys.stderr, end="")
    return 0 if command in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
