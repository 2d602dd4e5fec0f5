"""The raw layer: one method per AscendCL runtime call, every status checked, on the parts
of a Runtime (client/runtime/runtime.py says which part holds what).

    from simnpu.client.runtime import Runtime
    rt = Runtime()                      # the session; simnpu.client.runtime() is the process's
    rt.contexts.set_device(0)
    address = rt.memory.malloc(4096)

Calls marked "async" return at once; the rest block until the daemon answers.
"""

from simnpu.client.runtime.runtime import PARTS, FlatNameWarning, Runtime

__all__ = ["PARTS", "FlatNameWarning", "Runtime"]
