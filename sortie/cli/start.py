"""The ``sortie`` executable's entry: the process's start and end, kept short (every command
pays them, and `sortie exec` is run again and again). Each command runs in this process, which
loads only what the command needs (`sortie/cli/app.py`); no server runs between commands."""

from __future__ import annotations

import gc


def entry() -> None:
    """The console script ``sortie`` (and ``python -m sortie``)."""
    # Loading the modules creates a few hundred thousand objects that live until the end
    # (modules, classes, pydantic schemas): cyclic collections over them while they load are
    # wasted work (~35 ms). `app` freezes them and turns collection on once the command's
    # modules are in, and freezes everything at the end, so that the interpreter's last
    # collections skip them too (~45 ms).
    gc.disable()
    from sortie.cli import app

    app.entry()
