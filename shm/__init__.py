"""Shared memory: regions, the device-memory allocator and the device address space. No gRPC."""
