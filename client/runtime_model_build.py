"""The raw layer's explicitly built models (aclmdlRIBuildBegin .. aclmdlRIBuildEnd), stream
activation and switching, and labels: a mixin of Runtime (client/runtime.py), which sets the
state it uses. docs/model-build.md is the design; the models are the daemon's
(server/model_build.py). Labels and label lists are the daemon's handles (ints here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simnpu.client.last_error import records_errors
from simnpu.client.runtime_graphs import Model
from simnpu.proto import codes
from simnpu.proto import npu_pb2 as pb
from simnpu.proto.errors import NpuError

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from simnpu.client.callbacks import HostCallbacks
    from simnpu.client.runtime import ContextInfo
    from simnpu.client.transport import Connection


def _nonnull(value: int, name: str) -> None:
    if not value:
        raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"{name} is null")


class RuntimeModelBuild:
    # what the mixin uses of Runtime (client/runtime.py), which sets and defines all of it
    connection: Connection
    callbacks: HostCallbacks
    models: dict[int, Model]
    bound_streams: dict[int, int]

    if TYPE_CHECKING:

        def _call(self, body: Message) -> Any: ...
        def _current(self) -> ContextInfo: ...
        def _model(self, handle: int) -> Model: ...
        def add_model(self, handle: int) -> None: ...
        def stream(self, handle: int) -> int: ...

    # ---- building ------------------------------------------------------------------------------
    @records_errors
    def model_build_begin(self, flag: int) -> int:
        """aclmdlRIBuildBegin: a new, empty model of the current context (flag reserved, 0)."""
        reply = self._call(pb.BuildBeginRequest(flag=flag, context=self._current().handle))
        self.add_model(reply.model)
        return reply.model

    @records_errors
    def model_bind_stream(self, model: int, stream: int, flag: int, unbind: bool) -> None:
        """aclmdlRIBindStream / aclmdlRIUnbindStream. Blocks."""
        self._model(model)
        handle = self.stream(stream)
        self._call(pb.BindStreamRequest(model=model, stream=handle, flag=flag, unbind=unbind))
        if unbind:
            self.bound_streams.pop(handle, None)
        else:
            self.bound_streams[handle] = model

    @records_errors
    def model_end_task(self, model: int, stream: int) -> None:
        """aclmdlRIEndTask: the end-of-graph task on a bound stream."""
        self._model(model)
        self._call(pb.EndTaskRequest(model=model, stream=self.stream(stream)))

    @records_errors
    def model_build_end(self, model: int, reserve: object) -> None:
        """aclmdlRIBuildEnd: the model may be replayed (reserve must be null). Blocks."""
        kept = self._model(model)
        if reserve:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "reserve is reserved and must be null")
        reply = self._call(pb.BuildEndRequest(model=model))
        new_seqs = [seq for seq in reply.seqs if seq not in set(kept.seqs)]
        new_callbacks = [c for c in reply.callbacks if c not in set(kept.callbacks)]
        kept.seqs += new_seqs
        kept.callbacks += new_callbacks
        self.connection.keep_sites(new_seqs)
        self.callbacks.keep(new_callbacks)
        self.connection.expect_notice(-len(new_callbacks))  # they were not run

    # ---- stream control flow -------------------------------------------------------------------
    @records_errors
    def active_stream(self, active_stream: int, stream: int) -> None:
        """aclrtActiveStream: a task of a bound stream that starts another stream of its
        model."""
        _nonnull(active_stream, "activeStream")
        _nonnull(stream, "stream")
        self._call(
            pb.ActiveStreamRequest(
                active_stream=self.stream(active_stream), stream=self.stream(stream)
            )
        )

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
    ) -> None:
        """aclrtSwitchStream: a task of a bound stream that starts true_stream when
        `*left <condition> *right` holds when it runs (false_stream is reserved: null)."""
        _nonnull(left, "leftValue")
        _nonnull(right, "rightValue")
        _nonnull(true_stream, "trueStream")
        _nonnull(stream, "stream")
        if false_stream:
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM, "falseStream is reserved and must be null"
            )
        self._call(
            pb.SwitchStreamRequest(
                left=left,
                condition=condition,
                right=right,
                data_type=data_type,
                true_stream=self.stream(true_stream),
                stream=self.stream(stream),
            )
        )

    # ---- labels --------------------------------------------------------------------------------
    @records_errors
    def create_label(self) -> int:
        """aclrtCreateLabel."""
        return self._call(pb.LabelCreateRequest()).handle

    @records_errors
    def create_label_list(self, labels: list[int], num: int) -> int:
        """aclrtCreateLabelList: the first `num` labels of `labels`."""
        if not labels or num <= 0 or num > len(labels) or not all(labels[:num]):
            raise NpuError(
                codes.ACL_ERROR_INVALID_PARAM,
                f"labels ({len(labels or [])} given) must hold num = {num} labels, none null",
            )
        return self._call(pb.LabelCreateRequest(list=True, labels=labels[:num])).handle

    @records_errors
    def destroy_label(self, handle: int, is_list: bool) -> None:
        """aclrtDestroyLabel / aclrtDestroyLabelList."""
        _nonnull(handle, "labelList" if is_list else "label")
        self._call(pb.LabelDestroyRequest(handle=handle, list=is_list))

    @records_errors
    def set_label(self, label: int, stream: int) -> None:
        """aclrtSetLabel: the label marks the next place of a bound stream."""
        _nonnull(label, "label")
        self._call(pb.SetLabelRequest(label=label, stream=self.stream(stream)))

    @records_errors
    def switch_label_by_index(
        self, index: int, max_value: int, label_list: int, stream: int
    ) -> None:
        """aclrtSwitchLabelByIndex: a task of a bound stream that jumps to the label whose
        index is the uint32 at `index` when it runs."""
        _nonnull(index, "ptr")
        _nonnull(label_list, "labelList")
        self._call(
            pb.SwitchLabelRequest(
                index=index,
                max_value=max_value,
                label_list=label_list,
                stream=self.stream(stream),
            )
        )
