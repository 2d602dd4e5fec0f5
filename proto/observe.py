"""What tracing and checking mean on both sides: the flag bits and the option syntax.

A session is observed when the daemon was started with `--trace` / `--check`, or when the
client asks (SIMNPU_TRACE / SIMNPU_CHECK, or simnpu.client.observe). The client sends the
bits below in OP_OBSERVE; the daemon and the client parse the same option strings.
See docs/observability.md.
"""

from __future__ import annotations

TRACE = 1 << 0  # record every task on the timeline
MEMCHECK = 1 << 1  # out-of-bounds, use-after-free, cross-client access, leaks
INITCHECK = 1 << 2  # reads of device memory nothing has written
RACECHECK = 1 << 3  # cross-stream / cross-client data races (happens-before)
STRICT = 1 << 4  # a race fails the later task (507053) instead of being a warning

CHECKS = MEMCHECK | INITCHECK | RACECHECK
SITES = CHECKS  # the client sends call sites while a check is on (a trace-only client fills
# them into its own trace file from its site ring instead: nothing extra on the wire)

_NAMES = {
    "memcheck": MEMCHECK,
    "mem": MEMCHECK,
    "leaks": MEMCHECK,
    "initcheck": INITCHECK,
    "init": INITCHECK,
    "racecheck": RACECHECK,
    "races": RACECHECK,
    "race": RACECHECK,
    "strict": STRICT | RACECHECK,
    "all": CHECKS,
    "on": CHECKS,
    "1": CHECKS,
    "off": 0,
    "0": 0,
    "none": 0,
    "": 0,
}


def parse_checks(text: str | None) -> int:
    """'memcheck,races' -> MEMCHECK | RACECHECK; 'all' -> every check. ValueError if unknown."""
    bits = 0
    for word in (text or "").replace(" ", ",").lower().split(","):
        if word not in _NAMES:
            raise ValueError(
                f"unknown check {word!r} (use memcheck, initcheck, racecheck, strict "
                "or all, separated by commas)"
            )
        bits |= _NAMES[word]
    return bits


def describe(bits: int) -> str:
    """MEMCHECK | RACECHECK -> 'memcheck,racecheck'."""
    names = [
        name
        for name, bit in (
            ("trace", TRACE),
            ("memcheck", MEMCHECK),
            ("initcheck", INITCHECK),
            ("racecheck", RACECHECK),
            ("strict", STRICT),
        )
        if bits & bit
    ]
    return ",".join(names) or "off"


def render(report: dict, title: str) -> str:
    """The human-readable report of a JSON report (the daemon's --check-report file and the
    client's SIMNPU_CHECK_REPORT file look the same)."""
    lines = [
        f"simnpu check report: {title}",
        f"checks: {report['checks']}",
        f"{report['errors']} error(s), {report['warnings']} warning(s)"
        + (f", {report['dropped']} more not kept" if report.get("dropped") else ""),
        "",
    ]
    for number, finding in enumerate(report["findings"], 1):
        times = f" (x{finding['count']})" if finding["count"] > 1 else ""
        lines.append(
            f"[{number}] {finding['severity'].upper()} {finding['check']}: {finding['kind']}{times}"
        )
        lines.extend("    " + line for line in finding["text"].splitlines())
        lines.append("")
    if not report["findings"]:
        lines.append("nothing found")
    return "\n".join(lines).rstrip() + "\n"
