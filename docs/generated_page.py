"""What the scripts that write a generated part of a page share: the command line.

python docs/<script>.py           rewrite the page's generated part
python docs/<script>.py --check   exit 1 if the page differs from the code
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable


def main(
    argv: list[str],
    page: pathlib.Path,
    regenerate: Callable[[str], str],
    problem: type[Exception],
    usage: str,
) -> int:
    """Rewrite `page` as `regenerate(its text)` returns it, or with `--check` say whether it
    is already that; `problem` is what `regenerate` raises when the code cannot be rendered
    as the page promises (printed, exit 1)."""
    text = page.read_text(encoding="utf-8")
    try:
        wanted = regenerate(text)
    except problem as error:
        print(error, file=sys.stderr)
        return 1
    script = pathlib.Path(sys.argv[0]).name
    if argv == ["--check"]:
        if wanted != text:
            print(f"{page} is out of date: run python docs/{script}", file=sys.stderr)
            return 1
        return 0
    if argv:
        print(usage, file=sys.stderr)
        return 2
    page.write_text(wanted, encoding="utf-8")
    return 0
