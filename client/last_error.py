"""The thread's last error (aclrtGetLastError / aclrtPeekAtLastError) of the raw layer."""

from __future__ import annotations

import functools
import inspect

from simnpu.proto.errors import NpuError


def records_errors(method):
    """Keep a raised NpuError as the calling thread's last error (aclrtGetLastError).

    The wrapper is generated with the method's own parameters (as acl._api does), so a
    call costs no *args/**kwargs packing: it sits on every launch."""
    parameters = list(inspect.signature(method).parameters.values())
    names = ", ".join(p.name for p in parameters)
    source = (f"def wrapper({names}):\n"
              f"    try:\n"
              f"        return method({names})\n"
              f"    except NpuError as error:\n"
              f"        {parameters[0].name}._local.last_error = error\n"
              f"        raise\n")
    # named as the method's module: transport.caller_site() must see the frame as ours
    namespace = {"method": method, "NpuError": NpuError, "__name__": method.__module__}
    exec(source, namespace)  # noqa: S102 - built above from the method's own signature
    wrapper = functools.wraps(method)(namespace["wrapper"])
    wrapper.__defaults__ = method.__defaults__
    return wrapper
