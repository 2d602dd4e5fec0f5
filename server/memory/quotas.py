"""Per-client device-memory limits (quotas).

The daemon starts with a default limit for every client (`simnpu serve --memory-limit`,
bytes or a percentage of each device's memory; none by default). A client may lower its
own limit (the HELLO request carries SIMNPU_MEMORY_LIMIT; OP_SET_MEMORY_LIMIT changes it
later), never raise it past the daemon's default. A limit is per device and counts the
bytes a client's live blocks reserve (padding and huge granules included, as
aclrtGetMemInfo does). The allocator enforces it as one more placement constraint, with
ACL's out-of-memory code 207001, and aclrtGetMemInfo of a limited client reports the
limit as the total and what is left of it (or of the device, if less) as free.

Imported IPC memory is charged to the exporter, not the importer.
"""

from __future__ import annotations

from simnpu.proto.errors import invalid
from simnpu.shm.sizes import parse_size


def parse_limit(text: str, memory_bytes: int) -> int | None:
    """'512MiB' -> bytes, '25%' -> that share of `memory_bytes`; '' / 'none' / '0' -> None."""
    text = str(text).strip().lower()
    if text in ("", "none", "0"):
        return None
    if text.endswith("%"):
        try:
            number = float(text[:-1])
        except ValueError:
            raise ValueError(f"not a memory limit: {text!r} (examples: 512MiB, 25%)") from None
        if not 0 < number <= 100:
            raise ValueError(f"a memory limit in percent must be in (0, 100]: {text!r}")
        return max(1, int(memory_bytes * number / 100))
    return parse_size(text)


class Limits:
    """One client's limits: the daemon's default unless the client chose a lower one."""

    def __init__(self, default: int | None, devices: int):
        self.default = default
        self._chosen: list[int | None] = [None] * devices

    def of(self, device: int) -> int | None:
        """The limit in force on `device` (None: the whole device)."""
        chosen = self._chosen[device]
        return chosen if chosen is not None else self.default

    def set(self, device: int | None, limit: int) -> None:
        """Lower this client's limit on `device` (None: every device); 0 restores the default.

        A limit above the daemon's default is refused (107000): clients may only lower theirs.
        """
        if limit < 0:
            raise invalid(f"a memory limit cannot be negative ({limit})")
        if limit and self.default is not None and limit > self.default:
            raise invalid(
                f"a memory limit of {limit} bytes is above the daemon's default of "
                f"{self.default} bytes; a client can only lower its limit"
            )
        devices = range(len(self._chosen)) if device is None else [device]
        for index in devices:
            self._chosen[index] = limit or None


def mem_info(limit: int | None, used: int, device_free: int, capacity: int) -> tuple[int, int]:
    """(free, total) as aclrtGetMemInfo reports them to a client under `limit`."""
    if limit is None:
        return device_free, capacity
    return max(0, min(limit - used, device_free)), limit
