"""The control plane: the daemon's process (start, stop, devices, limits), the gRPC service,
a client's session and its handlers (one module per ACL concept), the session's fast
path, configuration and the `simnpu serve` command, and who is at the other end of a
session (credentials).

May import: every other folder of simnpu.server, simnpu.proto and simnpu.shm.
"""
