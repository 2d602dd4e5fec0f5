"""HCCL in the daemon: communicators and their root infos, matching the ranks' collectives
and running them, the reduce plan the AI cores carry out, the job rendezvous, and worlds
across hosts -- their plan, their state, their membership, the links between daemons and
the Gloo exchange process (docs/hccl.md, docs/multihost.md).

May import: simnpu.server.core, simnpu.server.memory, simnpu.server.graphs, simnpu.proto
and simnpu.shm; and of simnpu.server.units what starts a process and what the Gloo exchange
process runs (ending with the daemon, reductions).
"""
