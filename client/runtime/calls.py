"""How a part of the runtime sends a call to the daemon: a request it waits for, a request
nobody waits for, or an asynchronous command. Each is sent with the call site of the public
call it serves (`site`, taken where that call entered: client/transport.py's call_site);
without one -- a program called the part directly -- the site is taken here.

A task failure a request reports (a synchronize, most often) goes to the exception-info
callbacks (client/exceptions.py) before the request raises it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simnpu.client.exceptions import EXCEPTIONS
from simnpu.client.transport import call_site
from simnpu.proto.errors import NpuError

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.runtime.contexts import StreamRecord
    from simnpu.client.transport import Connection


class Calls:
    """The session's calls as the parts send them."""

    def __init__(self, connection: Connection, session_id: int, streams: dict[int, StreamRecord]):
        self._connection = connection
        self._session_id = session_id
        self._streams = streams  # the stream records, to name a failed task's device

    def request(self, body: Message, site: str | None = None) -> Any:
        """Send a request and wait for its reply body (the path of every call that answers).
        Blocks."""
        try:
            return self._connection.call(body, site or call_site())
        except NpuError as error:
            if error.task_seq:
                EXCEPTIONS.report(self._session_id, self._connection.log, self._streams, error)
            raise

    def post(self, body: Message, site: str | None = None) -> int:
        """Send a request nobody waits for (its failure is reported at the next synchronize);
        its sequence number. Never blocks."""
        return self._connection.post(body, site or call_site())

    def command(self, record: bytes, stream: int, site: str | None = None) -> int:
        """Send a packed asynchronous command on `stream` (0: none); its sequence number.
        Never blocks, but for room in a full submission ring."""
        return self._connection.send_command(record, site or call_site(), stream)
