"""The gRPC servicer: authenticate, open a session, pump messages in and replies out.

Nothing else happens here: decoding and execution live in simnpu.server.control.session. A session
is opened for its peer (server/control/credentials.py: the process its credentials ticket names, or
its host), within the daemon's limits; one whose client has not said hello within
--hello-timeout seconds is ended.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from simnpu.proto import bulk, npu_pb2, peer_credentials, service
from simnpu.server.control.session import CLOSED
from simnpu.server.core.tenants import Tenant
from simnpu.server.core.untrusted import escaped

log = logging.getLogger("simnpu.service")

UNPARSED = object()  # what a request or message that does not parse is received as


class NpuServicer:
    def __init__(self, daemon):
        self.daemon = daemon

    def handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            service.SERVICE,
            {
                "Session": grpc.stream_stream_rpc_method_handler(
                    self.Session,
                    request_deserializer=_or_unparsed(bulk.parse_client),
                    response_serializer=bulk.serialize,
                ),
                "Query": grpc.unary_unary_rpc_method_handler(
                    self.Query,
                    request_deserializer=_or_unparsed(npu_pb2.QueryRequest.FromString),
                    response_serializer=npu_pb2.QueryReply.SerializeToString,
                ),
                "Peer": grpc.stream_stream_rpc_method_handler(
                    self.Peer,
                    request_deserializer=_or_unparsed(npu_pb2.PeerMessage.FromString),
                    response_serializer=npu_pb2.PeerMessage.SerializeToString,
                ),
            },
        )

    def _authorize(self, context) -> Tenant | None:
        """The tenant whose token a TCP peer presented (server/control/credentials.py; it
        is refused without one); None for a Unix-socket peer (file permissions let it in)."""
        if context.peer().startswith("unix:"):
            return None
        presented = dict(context.invocation_metadata()).get(service.TOKEN_METADATA_KEY, "")
        tenant = self.daemon.tenancy.of_token(presented)
        if tenant is None:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "simnpu: missing or wrong token (set SIMNPU_TOKEN to the daemon's token)",
            )
        return tenant

    def Session(self, request_iterator, context):
        tenant = self._authorize(context)
        ticket = dict(context.invocation_metadata()).get(peer_credentials.TICKET_METADATA_KEY, "")
        peer = self.daemon.peers.identify(context.peer(), ticket)
        if tenant is None:
            tenant = self.daemon.tenancy.of_unix(peer)
        session = self.daemon.open_session(context.peer(), peer, tenant)
        if isinstance(session, str):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"simnpu: {session}")
        timeout_s = self.daemon.config.hello_timeout_s
        hello_watch = threading.Timer(timeout_s, self._end_if_silent, (session, context, timeout_s))
        hello_watch.daemon = True
        hello_watch.start()
        reader = threading.Thread(
            target=self._read,
            args=(session, request_iterator, hello_watch),
            name=f"simnpu-session-{session.id}",
            daemon=True,
        )
        reader.start()
        outbox = session.outbox
        item = outbox.get()
        while item is not CLOSED:
            if item.__class__ is bytes:  # a message encoded already: a reply with bulk bytes
                yield item
                item = outbox.get()
                continue
            message = npu_pb2.ServerMessage()
            while True:
                if isinstance(item, npu_pb2.Reply):
                    message.replies.append(item)
                else:
                    message.notices.append(item)
                item = None if outbox.empty() else outbox.get()
                if item is None or item is CLOSED or item.__class__ is bytes:
                    break
            yield message
            if item is None:
                item = outbox.get()

    @staticmethod
    def _end_if_silent(session, context, timeout_s: float) -> None:
        """End `session` if its client has not said hello (the hello makes its staging
        area)."""
        if session.staging is None:
            context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
            context.set_details(f"simnpu: no hello within {timeout_s:g} s (--hello-timeout)")
            session.outbox.put(CLOSED)

    def _read(self, session, request_iterator, hello_watch: threading.Timer) -> None:
        try:
            for parsed in request_iterator:
                if parsed is UNPARSED:
                    session.undecodable()
                    return
                session.handle_message(*parsed)
        except grpc.RpcError:
            pass  # the client went away; that is how most sessions end
        except Exception:
            session.owner.lines.exception(log, "%r: reading the session failed", session)
        finally:
            hello_watch.cancel()
            self.daemon.close_session(session)

    def _tenant(self, context) -> Tenant:
        """The caller's tenant: by its token on TCP (refused without one), by its
        credentials ticket on the Unix socket, as a session's."""
        tenant = self._authorize(context)
        if tenant is not None:
            return tenant
        ticket = dict(context.invocation_metadata()).get(peer_credentials.TICKET_METADATA_KEY, "")
        return self.daemon.tenancy.of_unix(self.daemon.peers.identify(context.peer(), ticket))

    def Query(self, request, context):
        viewer = self._tenant(context)
        if request is UNPARSED:
            self.daemon.query_lines.warning(
                log, "a query from %s does not parse", escaped(context.peer())
            )
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "simnpu: the query does not parse")
        return npu_pb2.QueryReply(
            json=json.dumps(self.daemon.describe(request.what, request.device, viewer))
        )

    def Peer(self, request_iterator, context):
        """A member daemon's stream for one world across hosts (server/hccl/world_membership.py).
        Only the operator opens one: its messages speak for any tenant's ranks."""
        tenant = self._tenant(context)
        first = next(request_iterator, None)
        if first is UNPARSED or first is None or first.WhichOneof("body") != "hello":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "simnpu: a Peer stream starts with a hello"
            )
        worlds = self.daemon.collectives.worlds
        jobs = self.daemon.jobs
        if worlds.advertise is None or jobs is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "simnpu: this daemon takes part in no worlds across hosts (no --advertise)",
            )
        if not tenant.operator:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "simnpu: only the operator links daemons (docs/security.md)",
            )
        assert first is not None and first is not UNPARSED  # (abort raised otherwise)
        hello = first.hello
        link = jobs.accept(hello) if hello.jobs else worlds.accept(hello)
        return link.serve(message for message in request_iterator if message is not UNPARSED)


def _or_unparsed(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`parse`, giving UNPARSED for bytes that do not parse: the servicer then says so in one
    log line (gRPC would log the parser's traceback)."""

    def tolerant(raw: bytes) -> Any:
        try:
            return parse(raw)
        except DecodeError:
            return UNPARSED

    return tolerant
