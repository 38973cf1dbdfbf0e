"""Who a ``fleetctl`` command acts as: ``$FLEET_USER``, else the OS user name (:func:`getpass.getuser`).

The CLI runs where the run history and the broker are reachable, so it is trusted as the person at it: the
name is recorded with the runs it starts and the cancels it sends (the HTTP API records its token's user
instead, :mod:`controller.serve.tokens`). Standard library only.
"""

from __future__ import annotations

import getpass
import os

ENV = "FLEET_USER"


def local_user() -> str:
    """``$FLEET_USER`` when set (a shared lab account, CI), else the OS user name; ``uid-N`` where neither
    names one (a container run under a numeric uid with no passwd entry)."""
    name = os.environ.get(ENV, "").strip()
    if name:
        return name
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no LOGNAME/USER/..., and the uid has no passwd entry
        return f"uid-{os.getuid()}"
