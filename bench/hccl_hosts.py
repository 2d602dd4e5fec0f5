"""HCCL all_reduce across hosts (docs/multihost.md), beside Gloo's own all_reduce.

Part of bench/hccl_bench.py (`--hosts 2 4`; needs the multihost extra). For each host
count H, starts H daemons, each a "host" with its own devices and shared memory, on
loopback TCP with one token, and runs 8 rank processes spread evenly over them (rank r on
host r // (8 / H)): an all_reduce of 64 MiB float32, timed as hccl_bench times every
collective. The limit, measured in the same run: Gloo's own all_reduce of 64 MiB between
H plain torch processes on loopback (bench/exchange_bench.py), which is what the exchange
processes between the hosts run on. The target (issue "One HCCL world across hosts"):
simnpu's algbw >= 70 % of Gloo's at 2 hosts.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
from collections.abc import Callable

import exchange_bench
from run import Daemon

RANKS = 8
SIZE = 64 << 20
TARGET = 0.70  # simnpu's algbw over Gloo's, at 2 hosts
GLOO_ITERS = 10


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_hosts(hosts: int, quick: bool, run_config: Callable) -> dict:
    """simnpu's all_reduce over `hosts` daemons (seconds per collective, out of place and
    in place) and Gloo's between `hosts` processes, each with the CPU the machine spent on
    one (out of place for simnpu)."""
    per_host = RANKS // hosts
    token = os.environ.get("SIMNPU_TOKEN") or secrets.token_hex(16)
    os.environ["SIMNPU_TOKEN"] = token  # the daemons' and the rank processes'
    memory = f"{(3 * SIZE + (16 << 20)) >> 20}MiB"  # send, recv and the host block
    daemons: list[Daemon] = []
    with tempfile.TemporaryDirectory(prefix="simnpu-hccl-hosts-") as directory:
        try:
            for _ in range(hosts):
                address = f"127.0.0.1:{_free_port()}"
                flags = ("--devices", str(per_host), "--advertise", address)
                daemons.append(Daemon(directory, memory, *flags, address=address))
            addresses = [daemons[r // per_host].address for r in range(RANKS)]
            devices = [r % per_host for r in range(RANKS)]
            table = run_config(addresses, RANKS, devices, ["all_reduce"], [SIZE], quick)
        finally:
            for daemon in daemons:
                daemon.close()
    gloo = exchange_bench.gloo_all_reduce(SIZE, GLOO_ITERS, processes=hosts)
    out, inside = table[("all_reduce", SIZE, "out")], table[("all_reduce", SIZE, "in")]
    return {
        "hosts": hosts,
        "ranks": RANKS,
        "size": SIZE,
        "out_s": out.seconds,
        "in_s": inside.seconds,
        "out_cpu_s": out.cpu_s,
        "gloo_s": gloo.ms / 1e3,
        "gloo_cpu_s": gloo.cpu_ms / 1e3,
        "cpus": len(os.sched_getaffinity(0)),
    }


def print_rows(rows: list[dict]) -> None:
    """One line per host count: simnpu's time, algbw and busbw (8 ranks) out of place and
    in place, Gloo's all_reduce between the hosts, and simnpu's algbw over Gloo's. Then the
    CPU each took, and the bound on simnpu over Gloo that the machine's CPUs set: at least
    simnpu's CPU / CPUs of wall time per collective, against Gloo's time."""
    print(
        f"\n# all_reduce across hosts, {RANKS} ranks, {SIZE >> 20} MiB float32, sum; beside "
        "Gloo's own all_reduce between the hosts (target at 2 hosts: out of place >= "
        f"{TARGET:.0%} of Gloo's algbw)"
    )
    print(
        f"# {'hosts':>5} {'ranks/host':>10} | {'out ms':>8} {'algbw':>7} {'busbw':>7} "
        f"| {'in ms':>8} {'algbw':>7} {'busbw':>7} | {'Gloo ms':>8} {'algbw':>7} | "
        "out / Gloo"
    )
    for row in rows:
        n, size = row["ranks"], row["size"]
        cells = []
        for key in ("out_s", "in_s"):
            algbw = size / row[key] / 1e9
            cells.append(f"{row[key] * 1e3:>8.1f} {algbw:>7.3f} {algbw * 2 * (n - 1) / n:>7.3f}")
        gloo_algbw = size / row["gloo_s"] / 1e9
        ratio = row["gloo_s"] / row["out_s"]
        row["of_gloo"] = ratio
        missed = "  (target MISSED)" if row["hosts"] == 2 and ratio < TARGET else ""
        print(
            f"  {row['hosts']:>5} {n // row['hosts']:>10} | {cells[0]} | {cells[1]} | "
            f"{row['gloo_s'] * 1e3:>8.1f} {gloo_algbw:>7.3f} | {ratio:>9.0%}{missed}"
        )
    cpus = rows[0]["cpus"]
    print(
        f"\n# CPU per all_reduce, every process on the machine (the hosts share its {cpus} "
        f"CPUs): simnpu out of place takes at least its CPU / {cpus} of wall time here, which "
        "bounds out / Gloo"
    )
    print(
        f"# {'hosts':>5} | {'simnpu CPU ms':>13} {'at least ms':>11} | {'Gloo CPU ms':>11} | bound"
    )
    for row in rows:
        least = row["out_cpu_s"] / cpus
        row["bound_of_gloo"] = row["gloo_s"] / least
        print(
            f"  {row['hosts']:>5} | {row['out_cpu_s'] * 1e3:>13.1f} {least * 1e3:>11.1f} | "
            f"{row['gloo_cpu_s'] * 1e3:>11.1f} | {row['bound_of_gloo']:>5.0%}"
        )
