"""The ``sortie`` executable's entry: the process's start and end, kept short (every command
pays them, and `sortie exec` is run again and again): a warm process runs the command where one
is up (`sortie/cli/warm.py`), else this one loads what the command needs."""

from __future__ import annotations

import gc
import sys


def entry() -> None:
    """The console script ``sortie`` (and ``python -m sortie``)."""
    # Loading the modules creates a few hundred thousand objects that live until the end
    # (modules, classes, pydantic schemas): cyclic collections over them while they load are
    # wasted work (~35 ms). `app` freezes them and turns collection on once the command's
    # modules are in, and freezes everything at the end, so that the interpreter's last
    # collections skip them too (~45 ms).
    from sortie.cli import warm

    code = warm.run_warm(sys.argv[1:])  # where sortie's modules are loaded already
    if code is not None:
        sys.exit(code)
    gc.disable()
    from sortie.cli import app

    app.entry()
