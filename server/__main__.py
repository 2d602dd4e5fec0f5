"""`python -m simnpu.server [flags]` runs the daemon, like `simnpu serve [flags]`."""

import sys

from simnpu.server.control.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
