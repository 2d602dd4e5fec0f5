"""The user tools of the `simnpu` command: `memory`, `smi`, `health`, `trace` and `check`,
each a client of a running daemon that opens no session."""
