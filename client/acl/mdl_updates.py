"""acl.mdl task groups and task changes of model run instances: updates without recapture
(client/runtime/task_groups.py, server/graphs/task_groups.py; docs/graph-capture.md, "Updates").

Written like the rest of acl.mdl (client/acl/mdl.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last; task
groups and model tasks are ints, parameters dicts with the C field names in snake case.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = [
    "ri_capture_task_grp_begin",
    "ri_capture_task_grp_end",
    "ri_capture_task_update_begin",
    "ri_capture_task_update_end",
    "ri_kernel_task_get_attribute",
    "ri_task_disable",
    "ri_task_get_params",
    "ri_task_set_params",
    "ri_update",
]


@api("k")
def ri_capture_task_grp_begin(rt, stream, *, site):
    """aclmdlRICaptureTaskGrpBegin: the kernels the capturing stream records next form a task
    group. 107029 not in capture, 107033 a group open already. Blocks."""
    rt.task_groups.task_grp_begin(stream, site=site)


@api("k", (0,))
def ri_capture_task_grp_end(rt, stream, *, site):
    """aclmdlRICaptureTaskGrpEnd: `handle, ret` of the group. 107033 none open; the error a
    task met in it (507009 not a kernel, 107034 a task of another stream of the capture);
    507903 the capture was invalidated. Blocks."""
    return rt.task_groups.task_grp_end(stream, site=site)


@api("kk")
def ri_capture_task_update_begin(rt, stream, handle, *, site):
    """aclmdlRICaptureTaskUpdateBegin: the kernels launched on `stream` (not in capture) until
    ri_capture_task_update_end replace the group's kernels in order, when the stream reaches
    them. 107027 a stream in capture; 107033 the stream or the group is updating. Blocks."""
    rt.task_groups.task_update_begin(stream, handle, site=site)


@api("k")
def ri_capture_task_update_end(rt, stream, *, site):
    """aclmdlRICaptureTaskUpdateEnd: 107033 not updating; 507000 if fewer kernels were
    launched than the group has. Blocks."""
    rt.task_groups.task_update_end(stream, site=site)


@api("k", ({},))
def ri_task_get_params(rt, task, *, site):
    """aclmdlRITaskGetParams: `params, ret` (aclmdlRITaskParams as a dict: type, task_grp,
    op_info_ptr, op_info_size and the member of its type, e.g. kernel_task_params)."""
    return rt.task_groups.task_get_params(task, site=site)


@api("kO")
def ri_task_set_params(rt, task, params, *, site):
    """aclmdlRITaskSetParams: new parameters (a dict as ri_task_get_params gives) for a
    kernel, value write or value wait task; ri_update makes them take effect. 107040 while
    the model is captured or runs; 107000 for wrong ones (the model is then faulted)."""
    rt.task_groups.task_set_params(task, params, site=site)


@api("kI", ({},))
def ri_kernel_task_get_attribute(rt, task, attr_id, *, site):
    """aclmdlRIKernelTaskGetAttribute: `attr_value, ret`, the aclrtLaunchKernelAttrValue
    field of `attr_id` as a dict (e.g. {"timeout": s}); 107000 for a task that is not a
    kernel or an attribute it cannot give."""
    return rt.task_groups.kernel_task_get_attribute(task, attr_id, site=site)


@api("k")
def ri_update(rt, model_ri, *, site):
    """aclmdlRIUpdate: the model's changed tasks take effect (replays refuse it with 507011
    before). 107040 if it is being captured or a change failed."""
    rt.task_groups.model_update(model_ri, site=site)


@api("k")
def ri_task_disable(rt, task, *, site):
    """aclmdlRITaskDisable: the task no longer runs in replays (after ri_update). 107040
    while the model is captured or runs."""
    rt.task_groups.task_disable(task, site=site)


__getattr__, __dir__ = _on_demand(globals())
