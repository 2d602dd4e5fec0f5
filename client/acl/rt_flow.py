"""acl.rt control flow of explicitly built models: stream activation and switching, labels
(client/runtime/model_build.py, server/graphs/flow_tasks.py; docs/model-build.md).

Written like the rest of acl.rt (client/acl/rt.py offers the calls this module lists in
`__all__` as its own): pyACL's argument checks and return shapes, the ACL code last. Labels
and label lists are ints. These tasks go only to streams bound to a model
(acl.mdl.ri_bind_stream): on another stream they return 107005.
"""

from __future__ import annotations

from simnpu.client.facade import api
from simnpu.client.facade import on_demand as _on_demand

__all__ = [
    "active_stream",
    "create_label",
    "create_label_list",
    "destroy_label",
    "destroy_label_list",
    "set_label",
    "switch_label_by_index",
    "switch_stream",
]


@api("kk")
def active_stream(rt, active_stream, stream, *, site):
    """aclrtActiveStream: a task of a bound stream that starts `active_stream`, a stream of
    the same model, when a replay reaches it. Blocks."""
    rt.model_build.active_stream(active_stream, stream, site=site)


@api("kikikkk")
def switch_stream(
    rt, left_value, cond, right_value, data_type, true_stream, false_stream, stream, *, site
):
    """aclrtSwitchStream: a task of a bound stream that starts `true_stream` when
    `*left_value <cond> *right_value` (aclrtCondition; values read as data_type,
    ACL_RT_SWITCH_INT32 / _INT64, when the replay reaches it) holds; false_stream is
    reserved (0). Blocks."""
    rt.model_build.switch_stream(
        left_value, cond, right_value, data_type, true_stream, false_stream, stream, site=site
    )


@api("", (0,))
def create_label(rt, *, site):
    """aclrtCreateLabel: `label, ret`."""
    return rt.model_build.create_label(site=site)


@api("Ok", (0,))
def create_label_list(rt, labels, num, *, site):
    """aclrtCreateLabelList: `label_list, ret` of the first `num` labels of the list
    `labels` (100000 if it holds fewer, or a null one)."""
    return rt.model_build.create_label_list(list(labels or []), num, site=site)


@api("k")
def destroy_label(rt, label, *, site):
    """aclrtDestroyLabel (a model that jumps to it keeps it)."""
    rt.model_build.destroy_label(label, False, site=site)


@api("k")
def destroy_label_list(rt, label_list, *, site):
    """aclrtDestroyLabelList."""
    rt.model_build.destroy_label(label_list, True, site=site)


@api("kk")
def set_label(rt, label, stream, *, site):
    """aclrtSetLabel: the label marks the next place of a bound stream (set once). Blocks."""
    rt.model_build.set_label(label, stream, site=site)


@api("kIkk")
def switch_label_by_index(rt, ptr, max_value, label_list, stream, *, site):
    """aclrtSwitchLabelByIndex: a task of a bound stream that jumps forward to the label of
    `label_list` whose index is the uint32 at `ptr` when the replay reaches it (an index
    past max_value - 1 takes the last label). Blocks."""
    rt.model_build.switch_label_by_index(ptr, max_value, label_list, stream, site=site)


__getattr__, __dir__ = _on_demand(globals())
