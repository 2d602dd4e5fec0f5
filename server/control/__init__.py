"""The control plane: the daemon's process (start, stop, devices, limits), the gRPC service,
a client's session and its handlers (one module per ACL concept), the session's fast
path, configuration and the `simnpu serve` command, and who is at the other end of a
session (credentials).

May import: every other folder of the daemon (simnpu.server.core, simnpu.server.units,
simnpu.server.memory, simnpu.server.graphs, simnpu.server.hccl, simnpu.server.observation,
simnpu.server.kernels), simnpu.proto and simnpu.shm.
"""
