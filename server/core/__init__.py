"""The core of the device: what every stream runs and how it is scheduled.

Streams, events, contexts and the client that owns them as the scheduler sees it; the task
kinds every stream runs (core/tasks/); the scheduler; the executor protocol and the units
as the scheduler sees them; the protocol between the scheduler and its units (the items of
a batch and what a unit reports); the device's units and ready queues; notifies, count
notifies and IPC events; and the interfaces features reach it through.

May import: simnpu.server.core, simnpu.proto and simnpu.shm. Features reach the core through
the interfaces it defines, never the other way round: graphs give streams their recorders
(recorder.py), HCCL gives the scheduler its dispatcher (dispatcher.py), observation
subscribes to the work (subscriber.py), the units carry batches through the executor
(executor.py: the daemon's executor also maps memory's window table for its units).
"""
