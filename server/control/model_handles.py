"""The handles a session gives models and their parts: model run instances (captured, built,
and the sub models of cond tasks), their streams and listed tasks, and the private streams of
replays (never in the table). The handlers of graphs, built models, task groups and cond
tasks share these (server/control/handlers/); what a model is and does is server/graphs/."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from simnpu.server.control.handle_kinds import HandleKind
from simnpu.server.graphs import model_runs
from simnpu.server.graphs.capture import Graph, Lane

if TYPE_CHECKING:
    from simnpu.server.control.session import Session
    from simnpu.server.core.streams import Context, Stream
    from simnpu.server.graphs.cond_handles import CondHandle


def model(session: Session, handle: int) -> Graph:
    """The model run instance behind `handle` (107017 otherwise)."""
    return session.handles.get(handle, Graph, "model run instance")


def new_model(session: Session, context: Context, cond: CondHandle | None = None) -> Graph:
    """A new, empty model of `context` with its handle and a daemon-wide id (a sub model of
    a cond task with `cond`)."""
    graph = Graph(0, session.daemon.next_model_id(), context, cond=cond)
    graph.handle = session.handles.add(graph, HandleKind.MODEL_RI)
    return graph


def new_lane(session: Session) -> Lane:
    """A new stream of a model, with its MODEL_STREAM handle."""
    lane = Lane(0)
    lane.handle = session.handles.add(lane, HandleKind.MODEL_STREAM)
    return lane


def lane_maker(session: Session) -> Callable[[Stream], Lane]:
    """How a capture of `session` makes a lane for a stream it pulls in."""
    return lambda stream: new_lane(session)


def replay_stream_handles(session: Session) -> Callable[[], int]:
    """How a replay names its private streams (never handles of the table)."""
    return lambda: (HandleKind.REPLAY_STREAM << 40) | session.handles.unique()


def drop(session: Session, graph: Graph) -> None:
    """`graph` goes (model_runs.release): the handles of it, its parts and its sub models
    with it."""
    for handle in model_runs.release(graph, session.memory):
        session.handles.remove(handle)


def dropper(session: Session) -> Callable[[Graph], None]:
    return lambda graph: drop(session, graph)
