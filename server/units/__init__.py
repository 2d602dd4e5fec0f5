"""The units at work: the processes that run a device's AI cores and copy engines and a
client's own kernels, and what the daemon uses to drive them.

The runner and its batch loop, the kernel API kernels see, each process's entry point
(`*_main.py`) and how it ends with the daemon, the report a kernel process sends and its
checks, the executor the daemon hands batches to, how the daemon spawns its processes, the
daemon's book of kernel processes, the sandbox those processes enter, and what units
compute besides kernels (copies, collectives' pieces, reduces, random numbers, float
overflow). No module runs in both the daemon and a process it starts but the protocol
between them (tests/server/test_process_boundaries.py).

May import: simnpu.server.core (its unit protocol and executor interface),
simnpu.server.kernels, simnpu.proto and simnpu.shm.
"""
