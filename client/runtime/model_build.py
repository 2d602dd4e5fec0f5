"""rt.model_build: explicitly built models (aclmdlRIBuildBegin .. aclmdlRIBuildEnd), stream
activation and switching, and labels -- a sub-part of rt.graphs (client/runtime/graphs.py),
which keeps the models. docs/model-build.md is the design; the models are the daemon's
(server/graphs/model_build.py). Labels and label lists are the daemon's handles (ints here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simnpu.client.last_error import records_errors
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError

if TYPE_CHECKING:
    from simnpu.client.runtime.graphs import Graphs
    from simnpu.client.runtime.shared import Shared


def _nonnull(value: int, name: str) -> None:
    if not value:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"{name} is null")


class ModelBuild:
    """Built-model, stream-control and label calls (see the module docstring)."""

    def __init__(self, shared: Shared, graphs: Graphs):
        self._calls, self._contexts = shared.calls, shared.contexts
        self._graphs = graphs  # the models (rt.graphs)

    # ---- building ------------------------------------------------------------------------------
    @records_errors
    def model_build_begin(self, flag: int, site: str | None = None) -> int:
        """aclmdlRIBuildBegin: a new, empty model of the current context (flag reserved, 0).
        Blocks."""
        request = pb.BuildBeginRequest(flag=flag, context=self._contexts.current().handle)
        reply = self._calls.request(request, site)
        self._graphs.add_model(reply.model)
        return reply.model

    @records_errors
    def model_bind_stream(
        self, model: int, stream: int, flag: int, unbind: bool, site: str | None = None
    ) -> None:
        """aclmdlRIBindStream / aclmdlRIUnbindStream. Blocks."""
        self._graphs.model(model)
        record = self._contexts.stream_record(stream)
        request = pb.BindStreamRequest(model=model, stream=record.handle, flag=flag, unbind=unbind)
        self._calls.request(request, site)
        record.bound_model = 0 if unbind else model

    @records_errors
    def model_end_task(self, model: int, stream: int, site: str | None = None) -> None:
        """aclmdlRIEndTask: the end-of-graph task on a bound stream. Blocks."""
        self._graphs.model(model)
        request = pb.EndTaskRequest(model=model, stream=self._contexts.stream(stream))
        self._calls.request(request, site)

    @records_errors
    def model_build_end(self, model: int, reserve: object, site: str | None = None) -> None:
        """aclmdlRIBuildEnd: the model may be replayed (reserve must be null). Blocks."""
        self._graphs.model(model)
        if reserve:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "reserve is reserved and must be null")
        reply = self._calls.request(pb.BuildEndRequest(model=model), site)
        self._graphs.keep_recorded(model, list(reply.seqs), list(reply.callbacks))

    # ---- stream control flow -------------------------------------------------------------------
    @records_errors
    def active_stream(self, active_stream: int, stream: int, site: str | None = None) -> None:
        """aclrtActiveStream: a task of a bound stream that starts another stream of its
        model. Blocks."""
        _nonnull(active_stream, "activeStream")
        _nonnull(stream, "stream")
        request = pb.ActiveStreamRequest(
            active_stream=self._contexts.stream(active_stream), stream=self._contexts.stream(stream)
        )
        self._calls.request(request, site)

    @records_errors
    def switch_stream(
        self,
        left: int,
        condition: int,
        right: int,
        data_type: int,
        true_stream: int,
        false_stream: int,
        stream: int,
        site: str | None = None,
    ) -> None:
        """aclrtSwitchStream: a task of a bound stream that starts true_stream when
        `*left <condition> *right` holds when it runs (false_stream is reserved: null).
        Blocks."""
        _nonnull(left, "leftValue")
        _nonnull(right, "rightValue")
        _nonnull(true_stream, "trueStream")
        _nonnull(stream, "stream")
        if false_stream:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, "falseStream is reserved and must be null"
            )
        request = pb.SwitchStreamRequest(
            left=left,
            condition=condition,
            right=right,
            data_type=data_type,
            true_stream=self._contexts.stream(true_stream),
            stream=self._contexts.stream(stream),
        )
        self._calls.request(request, site)

    # ---- labels --------------------------------------------------------------------------------
    @records_errors
    def create_label(self, site: str | None = None) -> int:
        """aclrtCreateLabel. Blocks."""
        return self._calls.request(pb.LabelCreateRequest(), site).handle

    @records_errors
    def create_label_list(self, labels: list[int], num: int, site: str | None = None) -> int:
        """aclrtCreateLabelList: the first `num` labels of `labels`. Blocks."""
        if not labels or num <= 0 or num > len(labels) or not all(labels[:num]):
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"labels ({len(labels or [])} given) must hold num = {num} labels, none null",
            )
        request = pb.LabelCreateRequest(list=True, labels=labels[:num])
        return self._calls.request(request, site).handle

    @records_errors
    def destroy_label(self, handle: int, is_list: bool, site: str | None = None) -> None:
        """aclrtDestroyLabel / aclrtDestroyLabelList. Blocks."""
        _nonnull(handle, "labelList" if is_list else "label")
        self._calls.request(pb.LabelDestroyRequest(handle=handle, list=is_list), site)

    @records_errors
    def set_label(self, label: int, stream: int, site: str | None = None) -> None:
        """aclrtSetLabel: the label marks the next place of a bound stream. Blocks."""
        _nonnull(label, "label")
        request = pb.SetLabelRequest(label=label, stream=self._contexts.stream(stream))
        self._calls.request(request, site)

    @records_errors
    def switch_label_by_index(
        self, index: int, max_value: int, label_list: int, stream: int, site: str | None = None
    ) -> None:
        """aclrtSwitchLabelByIndex: a task of a bound stream that jumps to the label whose
        index is the uint32 at `index` when it runs. Blocks."""
        _nonnull(index, "ptr")
        _nonnull(label_list, "labelList")
        request = pb.SwitchLabelRequest(
            index=index,
            max_value=max_value,
            label_list=label_list,
            stream=self._contexts.stream(stream),
        )
        self._calls.request(request, site)
