"""The control plane: the daemon's process (start, stop, devices), the gRPC service, a
client's session and its handle table, the session's handlers (`handlers/<concept>_calls.py`,
one module per ACL concept: decode, look up, call the feature, encode) and what they share
(the waits of calls: `synchronize.py`; the handles of models: `model_handles.py`; what handles
stand for: `handle_kinds.py`), the daemon's limits on clients (`client_limits.py`), the rate
and turn of their module loads (`module_loads.py`) and the AI-core limits clients set
(`core_limits.py`), the session's fast path, configuration and the `simnpu serve` command,
and who is at the other end of a session (credentials).

May import: every other folder of the daemon (simnpu.server.core, simnpu.server.units,
simnpu.server.memory, simnpu.server.graphs, simnpu.server.hccl, simnpu.server.observation,
simnpu.server.kernels), simnpu.proto and simnpu.shm.
"""
