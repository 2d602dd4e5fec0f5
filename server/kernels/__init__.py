"""Kernels in the daemon: the built-in library (`builtin.py`) and the parse of the modules
clients load (`discovery.py`).

May import: simnpu.proto and simnpu.kernel (the decorator a kernel module imports).
"""
