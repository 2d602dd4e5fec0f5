"""Graphs: stream capture into a model run instance and its replay (aclmdlRI), in the
spirit of torch.cuda.CUDAGraph / torch_npu.npu.NPUGraph (docs/graph-capture.md).

    g = npu.Graph()
    with npu.graph(g, stream=s):     # the tasks submitted to s are recorded, not run
        kernel.launch(2, x, y, n)    # (s is the current stream inside the block)
    g.replay()                       # the whole graph, one submission
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from simnpu.client.device import runtime
from simnpu.client.stream import Stream, current_stream
from simnpu.proto import codes

MODES = {
    "global": codes.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL,
    "thread_local": codes.ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": codes.ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
}


class Graph:
    """A graph of recorded tasks (a model run instance, aclmdlRI), empty until captured
    with graph() or capture_begin() / capture_end(). No ACL call until then. Local."""

    def __init__(self) -> None:
        self.handle = 0  # the model run instance, once a capture has ended
        self._stream = 0  # the stream being captured

    def __repr__(self) -> str:
        if not self.handle:
            return "<simnpu Graph (not captured)>"
        tasks = self.tasks()
        streams = len({task["stream"] for task in tasks})
        lines = [f"<simnpu Graph model {self.id}: {len(tasks)} task(s) on {streams} stream(s)"]
        lines.append(f"  {'task':<6} {'stream':<7} {'kind':<8} {'after':<8} name")
        for task in tasks:
            label = f"{task['stream']}.{task['seq_id']}"
            after = [f"{task['stream']}.{task['seq_id'] - 1}"] if task["seq_id"] else []
            if task["after"] is not None:
                after.append("{}.{}".format(*task["after"]))
            lines.append(
                f"  {label:<6} {task['stream']:<7} {task['kind']:<8} {','.join(after) or '-':<8} "
                f"{task['name']}"
            )
        return "\n".join(lines) + ">"

    def capture_begin(self, stream: Stream | None = None, mode: str = "global") -> None:
        """aclmdlRICaptureBegin: tasks submitted to `stream` (default: current_stream())
        are recorded from now on, not run; a graph captured before is appended to
        (aclmdlRICaptureToModelRIBegin: on streams of the graph of its own, not ordered
        after what it holds). `mode` "global", "thread_local" or "relaxed"
        (aclmdlRICaptureMode: which threads may not call aclrtMemcpy and the like meanwhile).
        Blocks."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
        handle = current_stream().handle if stream is None else stream.handle
        runtime().capture_begin(handle, MODES[mode], self.handle)
        self._stream = handle

    def capture_end(self) -> None:
        """aclmdlRICaptureEnd: the capture stops and its tasks become the graph's (NpuError
        507903 if a call refused during it invalidated it, 107025 if a stream it pulled in
        was not joined back). Blocks."""
        stream, self._stream = self._stream, 0
        self.handle = runtime().capture_end(stream)

    def replay(self, stream: Stream | None = None) -> None:
        """aclmdlRIExecuteAsync: run the whole graph on `stream` (default:
        current_stream()), in its recorded order, as one submission; a failure of one of its
        tasks is raised by the stream's next synchronize, naming where it was captured.
        Asynchronous."""
        handle = current_stream().handle if stream is None else stream.handle
        runtime().model_execute_async(self.handle, handle)

    def execute(self, timeout_ms: int = -1) -> None:
        """aclmdlRIExecute: run the whole graph and wait for it (`timeout_ms` -1 forever;
        NpuError 507046 when it passed). Blocks."""
        runtime().model_execute(self.handle, timeout_ms)

    def abort(self) -> None:
        """aclmdlRIAbort: its running replays end; their streams' next synchronize raises
        507023. Blocks."""
        runtime().model_abort(self.handle)

    @property
    def id(self) -> int:
        """aclmdlRIGetId: the graph's id, unique in the daemon. Blocks."""
        return runtime().model_get_id(self.handle)

    @property
    def name(self) -> str:
        """aclmdlRIGetName / aclmdlRISetName (assign it): the graph's name. Blocks."""
        return runtime().model_get_name(self.handle, 1 << 16)

    @name.setter
    def name(self, value: str) -> None:
        runtime().model_set_name(self.handle, value)

    def tasks(self) -> list[dict]:
        """aclmdlRIDebugJsonPrint's content: every task, stream by stream (the capture's
        origin 0), as {"stream", "seq_id", "kind", "name", "type" (aclmdlRITaskType), "call"
        (the captured call's number), "after" ([stream, seq_id] of the record a wait waits
        for, else None)}. Blocks."""
        dump = json.loads(
            runtime().model_debug_json(self.handle, codes.ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE)
        )
        return [
            {"stream": entry["stream"], **task}
            for entry in dump["streams"]
            for task in entry["task_list"]
        ]

    def destroy(self) -> None:
        """aclmdlRIDestroy (torch's reset()): waits for its running replays (up to 10 s, then
        NpuError 107037), then releases it; the Graph can be captured again. Blocks.
        Idempotent."""
        if self.handle:
            runtime().model_destroy(self.handle)
            self.handle = 0


@contextmanager
def graph(g: Graph, stream: Stream | None = None, mode: str = "global") -> Iterator[Graph]:
    """`with graph(g, stream=s, mode="global"):` captures into `g` the tasks submitted to
    `s` (current_stream() inside the block) and to the streams its events pull in
    (aclmdlRICaptureBegin .. aclmdlRICaptureEnd). Without `stream` a new stream is made for
    the capture and destroyed after. If the block raises, the capture ends and a graph it
    made is destroyed. Blocks."""
    own = stream is None
    capturing = Stream() if stream is None else stream
    try:
        g.capture_begin(capturing, mode)
        try:
            with capturing:
                yield g
        except BaseException:
            appended = g.handle
            try:
                g.capture_end()
            except Exception:  # the capture was refused already: it left no graph
                pass
            else:
                if not appended:  # made by this capture: it goes with the failed block
                    g.destroy()
            raise
        g.capture_end()
    finally:
        if own:
            capturing.destroy()
