"""How a message spells a ``fleetctl`` command: the one that works from here.

After ``make demo`` the project's ``fleetctl`` is ``.venv/bin/fleetctl``, not on PATH; a hint that
says ``fleetctl report latest`` then fails with "command not found". :func:`fleetctl` writes
``fleetctl ...`` when PATH finds the running program (or no running program is known), else the
running program's path as it was typed (``.venv/bin/fleetctl ...``). Every hint the controller
prints or raises goes through it. Standard library only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

NAME = "fleetctl"


def _running() -> str | None:
    """The running fleetctl as typed (``sys.argv[0]``), else the one installed beside this Python, else None."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name == NAME:
        return argv0
    beside = Path(sys.executable).parent / NAME  # `python -m controller`, the tests, an embedding program
    return str(beside) if beside.is_file() else None


def program() -> str:
    """``fleetctl`` when PATH finds the running one (or there is none), else its path, quoted for a shell."""
    running = _running()
    if running is None:
        return NAME
    found = shutil.which(NAME)
    try:
        if found is not None and os.path.samefile(found, running):
            return NAME
    except OSError:
        pass
    return shlex.quote(running)


def fleetctl(*words: str) -> str:
    """``fleetctl WORDS`` as a user can type it here, each word quoted for a shell where it needs it (a path
    with a space); placeholders such as ``FILE`` stay as they are."""
    return " ".join((program(), *(shlex.quote(w) for w in words)))
