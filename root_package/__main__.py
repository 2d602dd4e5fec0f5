"""`python -m simnpu ...` is the `simnpu` command."""

import sys

from simnpu.cli import main

sys.exit(main())
