"""Kernels in the daemon: the built-in library (`builtin.py`) and the parse of the modules
clients load (`discovery.py`, which runs it in a child process of its own: `parse_main.py`).

May import: simnpu.proto and simnpu.kernel (the decorator a kernel module imports).
"""
