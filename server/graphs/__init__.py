"""Graphs: stream capture into model run instances and their replay, explicitly built models
and their control flow (labels, stream switches), task groups updated without recapture,
and conditional tasks (docs/graph-capture.md, docs/model-build.md).

May import: simnpu.server.core, simnpu.server.memory, simnpu.proto and simnpu.shm.
"""
