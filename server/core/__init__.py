"""The core of the device: what every stream runs and how it is scheduled.

Streams, events, contexts and the client that owns them as the scheduler sees it; the task
kinds every stream runs (core/tasks/); the scheduler; the executor protocol and the units
as the scheduler sees them; the protocol between the scheduler and its units (the items of
a batch and what a unit reports); the device's units and ready queues; notifies, count
notifies and IPC events.

May import: simnpu.proto, simnpu.shm and the core itself. Features (memory, graphs, HCCL,
observation) reach the core through the interfaces it defines, never the other way round.
"""
