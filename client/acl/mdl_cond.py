"""acl.mdl conditional tasks of captured models: conditions and the cond tasks that choose
among sub models by them (client/runtime/graphs.py, server/graphs/cond_handles.py;
docs/graph-capture.md, "Conditional tasks").

Written like the rest of acl.mdl (client/acl/mdl.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last;
conditions and models are ints, aclmdlRICondTaskParams a dict {"handle", "type", "size"}
whose output array (modelRIArray) comes back as the list of new sub models.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = [
    "ri_add_cond_task",
    "ri_cond_handle_create",
    "ri_cond_handle_get_cond_ptr",
]


@api("kIi", (0,))
def ri_cond_handle_create(rt, model_ri, default_launch_value, flag, *, site):
    """aclmdlRICondHandleCreate: `handle, ret`, a condition of `model_ri` (being captured): a
    uint64 in device memory, 0 at first, freed with the model. With
    ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT each replay of the model sets it to
    default_launch_value when it is submitted. 107000 for another flag or a model not in the
    capture stage; 207000 for a built model. Blocks."""
    return rt.graphs.cond_handle_create(model_ri, default_launch_value, flag, site=site)


@api("k", (0,))
def ri_cond_handle_get_cond_ptr(rt, handle):
    """aclmdlRICondHandleGetCondPtr: `ptr, ret`, the device address of the condition's
    uint64 (write it with memcpy, copies or kernels). Host only."""
    return rt.graphs.cond_handle_get_cond_ptr(handle)


@api("OkI", ([],))
def ri_add_cond_task(rt, params, stream, flags, *, site):
    """aclmdlRIAddCondTask: `sub_models, ret`. Records on the capturing `stream` a task that,
    in each replay, runs sub_models[0] if the condition is not 0, else sub_models[1] if given
    (ACL_MODEL_RI_COND_TYPE_IF, size 1 or 2); sub_models[0] as long as it is not 0 (_WHILE,
    size 1); sub_models[value], none out of range (_SWITCH, size > 0). Fill each sub model
    with ri_capture_to_model_ri_begin .. ri_capture_end before the capture of `stream` ends
    (else 107045 there). 100000 null stream or params; 107000 bad type, size or flags, a null
    or used handle, a stream captured into another model; 107029 stream not in capture.
    Blocks."""
    return rt.graphs.add_cond_task(params, stream, flags, site=site)


__getattr__, __dir__ = _on_demand(globals())
