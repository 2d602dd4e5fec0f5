"""The calling thread's last error: the one slot that aclrtGetLastError / aclrtPeekAtLastError
(its code) and aclGetRecentErrMsg (its message) read, for the raw layer, `acl` and `hccl`
alike. Success leaves it as it is; reading the code or the message clears that part."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

F = TypeVar("F", bound=Callable[..., Any])

_slot = threading.local()  # .code, .message of this thread's last failed call


def keep(code: int, message: str) -> int:
    """A call of this thread failed with `code`; returns it."""
    _slot.code = code
    _slot.message = message
    return code


def explain(text: str) -> None:
    """The thread's last error message becomes `text` (its code stays)."""
    _slot.message = text


def code(clear: bool) -> int:
    """This thread's last error code (ACL_SUCCESS when none), cleared if asked."""
    value = getattr(_slot, "code", codes.ACL_SUCCESS)
    if clear:
        _slot.code = codes.ACL_SUCCESS
    return value


def message() -> str | None:
    """This thread's last error message (None when none), then cleared."""
    value = getattr(_slot, "message", None)
    _slot.message = None
    return value


_unrecorded: dict[Callable[..., Any], Callable[..., Any]] = {}  # wrapper -> the method it wraps


def records_errors(method: F) -> F:
    """A raw-layer method whose NpuError is also kept as the thread's last error.
    `unrecorded` gives the method without it, for callers that keep errors themselves."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except NpuError as error:
            keep(error.code, str(error))
            raise

    _unrecorded[wrapper] = method
    return wrapper  # type: ignore[return-value]


def unrecorded(method: Callable[..., Any]) -> Callable[..., Any]:
    """The method `records_errors` made `method` from, which does not keep its errors (the
    facade keeps them itself, one call less on the hot paths). TypeError for a method
    records_errors did not wrap."""
    try:
        return _unrecorded[method]
    except KeyError:
        raise TypeError(f"{method!r} does not record its errors (records_errors)") from None
