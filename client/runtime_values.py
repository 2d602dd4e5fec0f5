"""The raw layer's stream memory operations (aclrtValueWrite, aclrtValueWait): a 64-bit
word of device memory written, or waited on, in stream order (server/tasks/value.py).

A mixin of `Runtime` (client/runtime.py). The word must be 8-byte aligned and lie in an
allocation of this process; the daemon checks it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.client.last_error import records_errors
from simnpu.client.transport import caller_site
from simnpu.proto import commands
from simnpu.proto.errors import invalid

if TYPE_CHECKING:
    from simnpu.client.transport import Connection

WORD_BYTES = 8


class RuntimeValues:
    # what the mixin uses of Runtime (client/runtime.py), which sets all of it
    connection: Connection

    if TYPE_CHECKING:

        def stream(self, handle: int) -> int: ...
        def device_range(self, address: int, count: int) -> None: ...

    def _word(self, address: int) -> None:
        if address % WORD_BYTES:
            raise invalid(f"{address:#x} is not 8-byte aligned (a value is a 64-bit word)")
        self.device_range(address, WORD_BYTES)

    @records_errors
    def value_write(self, address: int, value: int, flag: int, stream: int) -> None:
        """aclrtValueWrite (async): flag is reserved (0)."""
        stream = self.stream(stream)
        commands.check_value_flag(commands.ValueWrite, flag)
        self._word(address)
        self.connection.send_command(
            commands.ValueWrite.pack(address, value, flag, stream), caller_site(), stream
        )

    @records_errors
    def value_wait(self, address: int, value: int, flag: int, stream: int) -> None:
        """aclrtValueWait (async): the stream waits until condition `flag` holds for the word."""
        stream = self.stream(stream)
        commands.check_value_flag(commands.ValueWait, flag)
        self._word(address)
        self.connection.send_command(
            commands.ValueWait.pack(address, value, flag, stream), caller_site(), stream
        )
