"""The invocation of one ``fleetctl`` command: its root options and the service session, opened on first use.

Lazy imports: :class:`controller.service.Session` is imported when a verb first asks for the session: it loads
the settings, the inventory and the run history, which ``fleetctl --help`` and ``version`` never need (~0.14 s
and ~0.22 s of CPU in all, ``bench/cli.py``: bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from controller.service import Session


@dataclass
class Invocation:
    """What the root options name; the service session is opened on first use and closed with the command."""

    config: Path | None = None
    inventory: Path | None = None
    history: str | None = None
    _session: Session | None = field(default=None, repr=False)

    def session(self) -> Session:
        if self._session is None:
            from controller.service import Session

            self._session = Session.load(self.config, inventory=self.inventory, history=self.history)
        return self._session

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


def session(ctx: typer.Context) -> Session:
    """The service session of the command being run (the invocation is every context's object)."""
    inv = ctx.obj
    assert isinstance(inv, Invocation)
    return inv.session()


def history_given(ctx: typer.Context) -> bool:
    """Whether ``--history`` named a run history (it wins over ``FLEET_SERVICE``)."""
    inv = ctx.obj
    assert isinstance(inv, Invocation)
    return inv.history is not None
