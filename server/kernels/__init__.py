"""Kernels in the daemon: the built-in library (`builtin.py`) and the parse of the modules
clients load (`discovery.py`)."""
