"""What npu.proto's schema says of its request and reply bodies, for both sides: which
oneof case a body goes in, and which of its fields are required.

    Request(id=7, create_stream=body)  ==  request(7, 0, body)

A body's case is found from its type (each body message is used by one case of Request and
of Reply), and the required fields from the schema's `(required)` option, both worked out
once per message type.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from simnpu.proto import npu_pb2


def _cases(envelope: type[Message]) -> dict[str, str]:
    """Body message name -> the case of `envelope`'s body oneof that carries it."""
    cases = {}
    for field in envelope.DESCRIPTOR.oneofs_by_name["body"].fields:
        assert field.message_type is not None, "every body case is a message"
        cases[field.message_type.full_name] = field.name
    return cases


_REQUEST_CASE = _cases(npu_pb2.Request)
_REPLY_CASE = _cases(npu_pb2.Reply)
_REPLY_CASES = frozenset(_REPLY_CASE.values())
_REQUIRED: dict[
    str, tuple[tuple[str, bool], ...]
] = {}  # message -> (field, is a message) of its required


def request(request_id: int, mailbox: int, body: Message) -> npu_pb2.Request:
    """The Request carrying `body` (a request body message)."""
    case: dict[str, Any] = {_REQUEST_CASE[body.DESCRIPTOR.full_name]: body}
    return npu_pb2.Request(id=request_id, mailbox=mailbox, **case)


def reply(
    request_id: int,
    body: Message | None = None,
    code: int = 0,
    message: str = "",
    task_seq: int = 0,
    device_output: str = "",
) -> npu_pb2.Reply:
    """The Reply to `request_id`, carrying `body` (a reply body message) if given, and what
    the client's kernels printed (a synchronize's)."""
    answer = npu_pb2.Reply(
        id=request_id, code=code, message=message, task_seq=task_seq, device_output=device_output
    )
    if body is not None:
        getattr(answer, reply_case(body)).CopyFrom(body)
    return answer


def reply_case(body: Message) -> str:
    """The name of the Reply case that carries `body`."""
    return _REPLY_CASE[body.DESCRIPTOR.full_name]


def request_case(body: Message) -> str:
    """The name of the Request case that carries `body`."""
    return _REQUEST_CASE[body.DESCRIPTOR.full_name]


def reply_body(reply: npu_pb2.Reply, request_body: Message) -> Any:
    """The body of `reply` to a request with `request_body`: the reply body of the same
    name, or None for a call that returns no values."""
    case = _REQUEST_CASE[request_body.DESCRIPTOR.full_name]
    return getattr(reply, case) if case in _REPLY_CASES else None


def missing(body: Message, prefix: str = "") -> list[str]:
    """The required fields `body` lacks (dotted names, nested messages checked too)."""
    name = body.DESCRIPTOR.full_name
    required = _REQUIRED.get(name)
    if required is None:
        required = _REQUIRED[name] = tuple(
            (field.name, field.message_type is not None)
            for field in body.DESCRIPTOR.fields
            if field.GetOptions().Extensions[npu_pb2.required]  # type: ignore[index]
        )
    absent = []
    for field, is_message in required:
        if not body.HasField(field):
            absent.append(prefix + field)
        elif is_message:
            absent += missing(getattr(body, field), f"{prefix}{field}.")
    return absent
