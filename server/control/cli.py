"""The `simnpu` command: `simnpu serve` runs the device daemon."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys

from simnpu.proto import codes, service
from simnpu.proto.observe import parse_checks
from simnpu.server.control import daemon_config as environment
from simnpu.server.control.daemon_config import DaemonConfig
from simnpu.server.core.core_shares import SHARE_WINDOW_S
from simnpu.server.core.reserves import parse_reserves
from simnpu.server.memory.quotas import parse_limit
from simnpu.shm.sizes import parse_size


def _serve_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="run the device daemon",
        description="Run the simulated NPU's device daemon until SIGTERM or Ctrl-C. Defaults "
        "in $NAME come from that environment variable when it is set.",
    )
    env = os.environ.get
    p.add_argument(
        "--listen",
        action="append",
        metavar="ADDRESS",
        help=f"gRPC address to listen on, repeatable: {service.ADDRESS_FORMS}; 0.0.0.0:port "
        "for every interface (default: $SIMNPU_LISTEN, comma-separated, else "
        "$SIMNPU_ADDRESS, else the per-user Unix socket "
        f"{service.default_address(env('XDG_RUNTIME_DIR'), os.getuid())})",
    )
    p.add_argument(
        "--devices",
        type=int,
        default=int(env("SIMNPU_DEVICES", "1")),
        metavar="N",
        help="number of devices (default: %(default)s, $SIMNPU_DEVICES)",
    )
    p.add_argument(
        "--memory",
        type=parse_size,
        default=env("SIMNPU_MEMORY", "2GiB"),
        metavar="SIZE",
        help="device memory per device, e.g. 512MiB, 2GiB (default: %(default)s, $SIMNPU_MEMORY)",
    )
    p.add_argument(
        "--memory-limit",
        default=env("SIMNPU_DEFAULT_MEMORY_LIMIT", ""),
        metavar="LIMIT",
        help="default device-memory limit of every client, e.g. 256MiB or 25%% of "
        "--memory (clients may lower theirs with SIMNPU_MEMORY_LIMIT) "
        "(default: none, $SIMNPU_DEFAULT_MEMORY_LIMIT)",
    )
    p.add_argument(
        "--ai-cores",
        type=int,
        default=int(env("SIMNPU_AI_CORES", "2")),
        metavar="N",
        help="AI cores (worker processes) per device (default: %(default)s, $SIMNPU_AI_CORES)",
    )
    p.add_argument(
        "--copy-engines",
        type=int,
        default=int(env("SIMNPU_COPY_ENGINES", "2")),
        metavar="N",
        help="copy engines (worker processes) per device "
        "(default: %(default)s, $SIMNPU_COPY_ENGINES)",
    )
    p.add_argument(
        "--staging",
        type=parse_size,
        default="32MiB",
        metavar="SIZE",
        help="per-client staging area for pageable copies (default: %(default)s)",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="file holding the tokens TCP clients may send: the operator's on its first "
        "line, then a line NAME TOKEN per tenant, as docs/security.md says "
        "(default: $SIMNPU_TOKEN, else the file $SIMNPU_TOKEN_FILE)",
    )
    p.add_argument(
        "--create-token",
        action="store_true",
        default=env("SIMNPU_CREATE_TOKEN") == "1",
        help="when no token is set and the token file does not exist, create it (mode "
        "0600) with a new random token (default: off, on with $SIMNPU_CREATE_TOKEN=1)",
    )
    p.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exit this long after the last client is gone (default: never; a daemon a "
        "client starts by itself gets $SIMNPU_IDLE_EXIT, else 5)",
    )
    p.add_argument(
        "--op-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="default operator execution timeout (aclrtSetOpExecuteTimeOut) (default: %(default)s)",
    )
    p.add_argument(
        "--core-share-window-ms",
        type=float,
        default=SHARE_WINDOW_S * 1000,
        metavar="MS",
        help="while several clients use a device's AI cores, each may hold only its share of "
        "them; a client counts for this long after its last AI-core work (0: only while its "
        "work is ready or running) (default: %(default)s)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="record every client's tasks; write the timeline as "
        "Chrome/Perfetto trace JSON to FILE at exit (default: no timeline)",
    )
    p.add_argument(
        "--trace-buffer",
        type=int,
        default=500_000,
        metavar="N",
        help="timeline records kept in memory, the oldest go first (default: %(default)s)",
    )
    p.add_argument(
        "--check",
        default="",
        metavar="LIST",
        help="check every client: memcheck, initcheck, racecheck, strict, or all, "
        "comma-separated (default: none)",
    )
    p.add_argument(
        "--check-report",
        metavar="FILE",
        help="write every finding to FILE at exit (default: none; simnpu check report "
        "asks a running daemon)",
    )
    p.add_argument(
        "--max-module-size",
        type=parse_size,
        default="1MiB",
        metavar="SIZE",
        help="the largest kernel module (Python source) a client may load; larger ones are "
        "ACL_ERROR_INVALID_FILE (default: %(default)s)",
    )
    p.add_argument(
        "--max-streams-per-client",
        type=int,
        default=1024,
        metavar="N",
        help="streams one client may have on a device, its contexts' default streams too, so "
        f"that it cannot take all {codes.MAX_STREAMS_PER_DEVICE} of them "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--max-events-per-client",
        type=int,
        default=32768,
        metavar="N",
        help="events one client may have on a device, so that it cannot take all "
        f"{codes.MAX_EVENTS_PER_DEVICE} of them (default: %(default)s)",
    )
    p.add_argument(
        "--reserve",
        action="append",
        default=[],
        metavar="RESERVE",
        help="KIND=N: keep the last N of a resource for processes that start, which a process "
        "that holds more than an eighth of it cannot take; KIND is memory (a SIZE or PERCENT "
        "of each device's), sessions, streams, events, notifies or cnt_notifies; 0 keeps "
        "none; repeat for several (docs/security.md) (default: memory=6.25%%, sessions=8, "
        "streams=64, events=1024, notifies=256, cnt_notifies=256)",
    )
    p.add_argument(
        "--log-level",
        default=env("SIMNPU_LOG_LEVEL", "INFO"),
        metavar="LEVEL",
        help="DEBUG, INFO, WARNING or ERROR (default: %(default)s, $SIMNPU_LOG_LEVEL)",
    )
    p.add_argument(
        "--advertise",
        default=env("SIMNPU_ADVERTISE"),
        metavar="HOST:PORT",
        help="the address other hosts' daemons reach this one at, for HCCL worlds across "
        "hosts (docs/multihost.md); root infos carry it (default: $SIMNPU_ADVERTISE, else "
        "the first TCP --listen address, with the host's name for 0.0.0.0)",
    )
    p.add_argument(
        "--hello-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="end a session whose client has not said hello this long after connecting "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--max-sessions-per-peer",
        type=int,
        default=16,
        metavar="N",
        help="sessions one client may hold: one process (Unix socket), one remote host (TCP), "
        "or all Unix clients without credentials together; the daemon holds "
        f"{DaemonConfig.max_sessions} in all (default: %(default)s)",
    )


def serve(args) -> int:
    os.environ.setdefault("GRPC_EXPERIMENTS", service.FAST_GRPC_EXPERIMENTS)
    from simnpu.server.control.daemon import Daemon
    from simnpu.server.units import gc_tuning
    from simnpu.shm import heap

    heap.keep_freed_memory()  # in-stream copy chunks reuse warm memory (shm/heap.py)

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s simnpu %(levelname)s %(message)s"
    )
    try:
        if args.create_token:
            create_token_file(args.token_file)
        tokens = environment.read_tokens(args.token_file)
    except (OSError, ValueError) as error:
        print(f"simnpu: cannot read the token file: {error}", file=sys.stderr)
        return 2
    listen = args.listen or environment.environment_listen()
    try:
        memory_limit = parse_limit(args.memory_limit, args.memory)
        reserves = parse_reserves(args.reserve, args.memory)
        checks = parse_checks(args.check)
        for address in listen:
            _check_address(address)
        advertise = args.advertise or environment.default_advertise(listen)
        if advertise is not None:
            _check_address(advertise)
    except ValueError as error:
        print(f"simnpu: {error}", file=sys.stderr)
        return 2
    config = DaemonConfig(
        listen=listen,
        devices=args.devices,
        memory_bytes=args.memory,
        ai_cores=args.ai_cores,
        copy_engines=args.copy_engines,
        staging_bytes=args.staging,
        token=tokens[0][1] if tokens else None,
        tenants=tuple(tokens[1:]),
        idle_exit_s=args.idle_exit,
        op_timeout_s=args.op_timeout,
        core_share_window_s=args.core_share_window_ms / 1000,
        memory_limit=memory_limit,
        trace_path=args.trace,
        checks=checks,
        check_report=args.check_report,
        trace_buffer=args.trace_buffer,
        max_module_bytes=args.max_module_size,
        max_streams_per_client=args.max_streams_per_client,
        max_events_per_client=args.max_events_per_client,
        hello_timeout_s=args.hello_timeout,
        max_sessions_per_peer=args.max_sessions_per_peer,
        advertise=advertise,
        reserves=reserves,
    )
    try:
        daemon = Daemon(config)
        daemon.install_signal_handlers()
        daemon.start()
    except (ValueError, RuntimeError, OSError) as error:
        print(f"simnpu: cannot start the daemon: {error}", file=sys.stderr)
        return 2
    gc_tuning.settle()
    daemon.wait()
    return 0


def _check_address(address: str) -> None:
    """ValueError naming `address` if it is not one the clients understand."""
    try:
        service.parse_address(address)
    except ValueError as error:
        raise ValueError(
            f"cannot listen on {address!r}: {error}; the accepted forms are {service.ADDRESS_FORMS}"
        ) from None


def create_token_file(flag_file: str | None) -> None:
    """--create-token: write a random token to the token file unless one is set already."""
    path = environment.token_file(flag_file)
    if not path:
        return
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    logging.getLogger("simnpu.daemon").info("created a new token in %s", path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="simnpu", description="a simulated Ascend NPU shared by many processes"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    args = parser.parse_args(argv)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
