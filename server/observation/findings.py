"""What the checkers found: findings, their de-duplication, and the human-readable report.

A finding is an error (out-of-bounds, use-after-free, cross-client access, uninitialised
read, freed while in use; a race in strict mode) or a warning (a race, a leak). The same
bug in a loop is one finding with a count: findings are keyed by their kind and the call
sites (and task descriptions) involved. Each session keeps its own findings (what its
client fetches with OP_OBSERVE_REPORT and writes to its report file); the daemon keeps
all of them for `simnpu serve --check-report FILE` and the Query RPC ("check_report").
"""

from __future__ import annotations

import logging
import time

from simnpu.server.core.untrusted import escaped

log = logging.getLogger("simnpu.check")

MAX_FINDINGS = 1000  # distinct findings kept per session and for the daemon


class Finding:
    __slots__ = ("check", "count", "details", "first_ns", "kind", "session", "severity", "text")

    def __init__(self, check, kind, severity, text, details, session):
        self.check, self.kind, self.severity, self.text = check, kind, severity, text
        self.details, self.session, self.count = details, session, 1
        self.first_ns = time.monotonic_ns()

    def as_dict(self) -> dict:
        return {
            "check": self.check,
            "kind": self.kind,
            "severity": self.severity,
            "count": self.count,
            "session": self.session.id if self.session is not None else None,
            "pid": getattr(self.session, "pid", None),
            "text": self.text,
            **self.details,
        }


class Findings:
    """Distinct findings in the order first seen, with repeat counts."""

    def __init__(self):
        self.by_key: dict = {}
        self.dropped = 0

    def add(self, key, make) -> tuple[Finding, bool]:
        """The finding under `key` (counted once more), or a new one from make(); (finding, new)."""
        finding = self.by_key.get(key)
        if finding is not None:
            finding.count += 1
            return finding, False
        finding = make()
        if len(self.by_key) < MAX_FINDINGS:
            self.by_key[key] = finding
        else:
            self.dropped += 1
        return finding, True

    def __len__(self) -> int:
        return len(self.by_key)

    def all(self) -> list[Finding]:
        return list(self.by_key.values())

    def counts(self) -> dict:
        errors = sum(1 for f in self.by_key.values() if f.severity == "error")
        return {"errors": errors, "warnings": len(self.by_key) - errors, "dropped": self.dropped}

    def as_json(self, checks: str, extra: list | None = None) -> dict:
        items = [f.as_dict() for f in self.by_key.values()] + [f.as_dict() for f in (extra or [])]
        errors = sum(1 for f in items if f["severity"] == "error")
        return {
            "checks": checks,
            "errors": errors,
            "warnings": len(items) - errors,
            "dropped": self.dropped,
            "findings": items,
        }


def task_line(ref: dict, blocks=None) -> str:
    """'kernel scale_f32 blocks 0-3 (task 13) on stream 4 of client 1234 (python), submitted at
    app.py:15'"""
    what = ref["what"]
    if blocks is not None:
        what += (
            f" block {blocks[0]}" if blocks[0] == blocks[1] else f" blocks {blocks[0]}-{blocks[1]}"
        )
    return (
        f"{what} (task {ref['task']}) on {ref['stream']} of client {ref['pid']} "
        f"({ref['process']}), submitted at {ref['site']}"
    )


def log_finding(finding: Finding) -> None:
    level = logging.ERROR if finding.severity == "error" else logging.WARNING
    first = escaped(finding.text.splitlines()[0]) if finding.text else ""
    log.log(level, "%s %s: %s (%r)", finding.check, finding.kind, first, finding.session)
