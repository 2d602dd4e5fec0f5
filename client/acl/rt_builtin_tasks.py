"""acl.rt built-in device tasks: a reduce of device memory into device memory, and random
numbers, in stream order (client/runtime/kernels.py, server/core/tasks/reduce_copy.py,
server/core/tasks/random_num.py).

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = ["random_num_async", "reduce_async"]


@api("kkKiikk", nonnull=("dst", "src"), delegate="kernels.reduce_async")
def reduce_async(rt, dst, src, count, kind, data_type, stream, reserve):
    """aclrtReduceAsync (async): dst = dst (op) src element-wise over `count` bytes;
    kind ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM (10), _MAX (11) or _MIN (12); `reserve` must be 0."""


@api("Okk", nonnull=("task_info",))
def random_num_async(rt, task_info, stream, reserve, *, site):
    """aclrtRandomNumAsync (async): `task_info` is an aclrtRandomNumTaskInfo dict (fields in
    snake case; an aclrtRandomParaInfo is {"is_addr", "value_or_addr", "size"}); `reserve`
    must be 0."""
    if not isinstance(task_info, dict):
        raise TypeError("acl.rt.random_num_async: task_info must be a dict")
    rt.kernels.random_num_async(task_info, stream, reserve, site=site)


__getattr__, __dir__ = _on_demand(globals())
