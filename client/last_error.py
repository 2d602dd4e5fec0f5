"""The thread's last error (aclrtGetLastError / aclrtPeekAtLastError) of the raw layer."""

from __future__ import annotations

import functools

from simnpu.proto.errors import NpuError


def records_errors(method):
    """Keep a raised NpuError as the calling thread's last error (aclrtGetLastError)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except NpuError as error:
            self._local.last_error = error
            raise

    return wrapper
