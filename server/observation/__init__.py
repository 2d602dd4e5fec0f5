"""Observation: the timeline, memory checking and race detection of observed sessions, what
they found, and the `simnpu smi` view (docs/observability.md). Off unless asked for.

May import: simnpu.server.core, simnpu.server.memory, simnpu.server.graphs, simnpu.proto and
simnpu.shm.
"""
