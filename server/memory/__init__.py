"""Device memory as the daemon keeps it: one client's allocations, imports, limits and pools;
the host's limit on committed memory; IPC and shareable memory between clients; virtual
memory (reserved ranges, physical memory, mappings); registered host memory; the
statistics and snapshot views.

May import: simnpu.server.core, simnpu.proto and simnpu.shm.
"""
