"""Graphs: stream capture into a model run instance and its replay (aclmdlRI), in the
spirit of torch.cuda.CUDAGraph / torch_npu.npu.NPUGraph (docs/graph-capture.md).

    g = npu.Graph()
    with npu.graph(g, stream=s):     # the tasks submitted to s are recorded, not run
        kernel.launch(2, x, y, n)    # (s is the current stream inside the block)
    g.replay()                       # the whole graph, one submission

Task groups update a graph without recapture, through the same calls as acl.mdl's:

    with npu.graph(g, stream=s):
        with g.task_group() as group:    # its kernels can be replaced later
            kernel.launch(2, x, y, n)
    with g.update(group, stream=u):      # the replays after it run the new kernels
        kernel.launch(2, x, w, n)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from simnpu.client.device import runtime
from simnpu.client.stream import Stream, current_stream
from simnpu.client.transport import call_site
from simnpu.proto import codes
from simnpu.proto.errors import NpuError

MODES = {
    "global": codes.ACL_MODEL_RI_CAPTURE_MODE_GLOBAL,
    "thread_local": codes.ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": codes.ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
}


class TaskGroup:
    """A task group of a Graph: the kernels recorded in a `with g.task_group() as group:`
    block, which `with g.update(group):` replaces (aclrtTaskGrp). `handle` is 0 until the
    block ended without an error. Made by Graph.task_group(). No ACL call. Local."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.handle = 0

    def __repr__(self) -> str:
        return f"<simnpu TaskGroup {self.handle:#x}>" if self.handle else "<simnpu TaskGroup>"


class Graph:
    """A graph of recorded tasks (a model run instance, aclmdlRI), empty until captured
    with graph() or capture_begin() / capture_end(). No ACL call until then. Local."""

    def __init__(self) -> None:
        self.handle = 0  # the model run instance, once a capture has ended
        self._stream: Stream | None = None  # the stream being captured

    def __repr__(self) -> str:
        if not self.handle:
            return "<simnpu Graph (not captured)>"
        tasks = self.tasks()
        streams = len({task["stream"] for task in tasks})
        groups: dict[int, str] = {}  # group handle -> its label, g1 .. in the order met
        for task in tasks:
            if task["group"]:
                groups.setdefault(task["group"], f"g{len(groups) + 1}")
        lines = [f"<simnpu Graph model {self.id}: {len(tasks)} task(s) on {streams} stream(s)"]
        lines.append(f"  {'task':<6} {'stream':<7} {'kind':<8} {'after':<8} {'group':<6} name")
        for task in tasks:
            label = f"{task['stream']}.{task['seq_id']}"
            after = [f"{task['stream']}.{task['seq_id'] - 1}"] if task["seq_id"] else []
            if task["after"] is not None:
                after.append("{}.{}".format(*task["after"]))
            group = groups.get(task["group"], "-")
            lines.append(
                f"  {label:<6} {task['stream']:<7} {task['kind']:<8} {','.join(after) or '-':<8} "
                f"{group:<6} {task['name']}"
            )
        return "\n".join(lines) + ">"

    def capture_begin(self, stream: Stream | None = None, mode: str = "global") -> None:
        """aclmdlRICaptureBegin: tasks submitted to `stream` (default: current_stream())
        are recorded from now on, not run. A graph is captured once: NpuError 107026 if it
        holds one (destroy() it first), as the runtime's aclmdlRICaptureToModelRIBegin takes
        only a model never captured. `mode` "global", "thread_local" or "relaxed"
        (aclmdlRICaptureMode: which threads may not call aclrtMemcpy and the like meanwhile).
        Blocks."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
        capturing = current_stream() if stream is None else stream
        runtime().graphs.capture_begin(capturing.handle, MODES[mode], self.handle, site=call_site())
        self._stream = capturing

    def capture_end(self) -> None:
        """aclmdlRICaptureEnd: the capture stops and its tasks become the graph's (NpuError
        507903 if a call refused during it invalidated it, 107025 if a stream it pulled in
        was not joined back). Blocks."""
        stream, self._stream = self._stream, None
        handle = 0 if stream is None else stream.handle
        self.handle = runtime().graphs.capture_end(handle, site=call_site())

    def replay(self, stream: Stream | None = None) -> None:
        """aclmdlRIExecuteAsync: run the whole graph on `stream` (default:
        current_stream()), in its recorded order, as one submission; a failure of one of its
        tasks is raised by the stream's next synchronize, naming where it was captured.
        Asynchronous."""
        handle = current_stream().handle if stream is None else stream.handle
        runtime().graphs.model_execute_async(self.handle, handle, site=call_site())

    def execute(self, timeout_ms: int = -1) -> None:
        """aclmdlRIExecute: run the whole graph and wait for it (`timeout_ms` -1 forever;
        NpuError 507046 when it passed). Blocks."""
        runtime().graphs.model_execute(self.handle, timeout_ms, site=call_site())

    def abort(self) -> None:
        """aclmdlRIAbort: its running replays end; their streams' next synchronize raises
        507023. Blocks."""
        runtime().graphs.model_abort(self.handle, site=call_site())

    @property
    def id(self) -> int:
        """aclmdlRIGetId: the graph's id, unique in the daemon. Blocks."""
        return runtime().graphs.model_get_id(self.handle, site=call_site())

    @property
    def name(self) -> str:
        """aclmdlRIGetName / aclmdlRISetName (assign it): the graph's name. Blocks."""
        return runtime().graphs.model_get_name(self.handle, 1 << 16, site=call_site())

    @name.setter
    def name(self, value: str) -> None:
        runtime().graphs.model_set_name(self.handle, value, site=call_site())

    def tasks(self) -> list[dict]:
        """aclmdlRIDebugJsonPrint's content: every task, stream by stream (the capture's
        origin 0), as {"stream", "seq_id", "kind", "name", "type" (aclmdlRITaskType), "call"
        (the captured call's number), "after" ([stream, seq_id] of the record a wait waits
        for, else None), "group" (the handle of the task group of a kernel, else 0), "handle"
        (the task's, aclmdlRIGetStreams / aclmdlRIGetTasksByStream: for disable())}.
        Blocks."""
        graphs, site = runtime().graphs, call_site()
        verbose = codes.ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE
        dump = json.loads(graphs.model_debug_json(self.handle, verbose, site=site))
        lanes = [
            graphs.model_get_tasks_by_stream(lane, site=site)
            for lane in graphs.model_get_streams(self.handle, site=site)
        ]
        return [
            {"stream": entry["stream"], **task, "handle": lanes[entry["stream"]][task["seq_id"]]}
            for entry in dump["streams"]
            for task in entry["task_list"]
        ]

    @contextmanager
    def task_group(self, stream: Stream | None = None) -> Iterator[TaskGroup]:
        """`with g.task_group() as group:` inside a capture: the kernels recorded on `stream`
        (default: the capture's stream; current inside the block) form one task group, whose
        kernels update() replaces later (aclmdlRICaptureTaskGrpBegin ..
        aclmdlRICaptureTaskGrpEnd). NpuError 107029 on a stream not in capture, 107033 with a
        group open on it already or one it updates; at the end of the block 507009 if a task
        that is not a kernel was submitted to `stream` in it, 107034 if another stream of the
        capture was given a task meanwhile, 507903 if the capture was invalidated. Blocks (the
        launches inside are recorded as usual)."""
        grouping = stream if stream is not None else self._stream or current_stream()
        group = TaskGroup(self)
        task_groups, site = runtime().task_groups, call_site()
        task_groups.task_grp_begin(grouping.handle, site=site)
        try:
            with grouping:
                yield group
        except BaseException:
            try:
                task_groups.task_grp_end(grouping.handle, site=site)
            except NpuError:  # the block's own error is the one to raise
                pass
            raise
        group.handle = task_groups.task_grp_end(grouping.handle, site=site)

    @contextmanager
    def update(self, group: TaskGroup, stream: Stream | None = None) -> Iterator[TaskGroup]:
        """`with g.update(group, stream=s):` outside a capture: the kernels launched on `s`
        (default: current_stream(); current inside the block) replace the group's kernels, in
        order, each when `s` reaches its launch: replays that reach the group after that run
        the new kernels -- later ones, and one queued before that waits for an event `s`
        records after the block (aclmdlRICaptureTaskUpdateBegin ..
        aclmdlRICaptureTaskUpdateEnd). Other tasks given to `s` run as usual. NpuError 100000
        for a group of another graph or one not made, 107017 one of a destroyed graph, 107027
        on a stream in capture, 107033 a stream or group updating already; at the end of the
        block 507000 if fewer kernels were launched than the group has (a launch too many
        fails with 507000 at the next synchronize of `s`). Blocks (the launches inside are
        asynchronous)."""
        if group.graph is not self:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, "the task group is another graph's")
        updating = current_stream() if stream is None else stream
        task_groups, site = runtime().task_groups, call_site()
        task_groups.task_update_begin(updating.handle, group.handle, site=site)
        try:
            with updating:
                yield group
        except BaseException:
            try:
                task_groups.task_update_end(updating.handle, site=site)
            except NpuError:  # the block's own error is the one to raise
                pass
            raise
        task_groups.task_update_end(updating.handle, site=site)

    def disable(self, task: dict | int) -> None:
        """aclmdlRITaskDisable, then aclmdlRIUpdate: the task (an entry of tasks(), or its
        "handle") no longer runs in the graph's replays from the next one on. NpuError 100000
        for a task of another graph, 107040 while the graph is captured or a replay of it is
        queued or runs, 107000 for a task that cannot be disabled (not a kernel, event or
        value task; the graph no longer replays then: destroy it). Blocks."""
        rt, site = runtime(), call_site()
        handle = task["handle"] if isinstance(task, dict) else task
        if not handle or rt.graphs.task_model(handle) != self.handle:
            raise NpuError(codes.ACL_ERROR_INVALID_PARAM, f"task {handle:#x} is not this graph's")
        rt.task_groups.task_disable(handle, site=site)
        rt.task_groups.model_update(self.handle, site=site)

    def destroy(self) -> None:
        """aclmdlRIDestroy (torch's reset()): waits for its running replays (up to 10 s, then
        NpuError 107037), then releases it; the Graph can be captured again. Blocks.
        Idempotent."""
        if self.handle:
            runtime().graphs.model_destroy(self.handle, site=call_site())
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
            try:
                g.capture_end()
            except Exception:  # the capture was refused already: it left no graph
                pass
            else:
                g.destroy()  # the graph goes with the failed block
            raise
        g.capture_end()
    finally:
        if own:
            capturing.destroy()
