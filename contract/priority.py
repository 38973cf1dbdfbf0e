"""Run priorities: the names people use, the number each travels under on the broker, and who goes first.

A module runs one thing at a time; when it frees up, the waiting run of the highest priority starts, and among
equals the one sent first. The number is the message's ``priority`` property, lower first, as kombu's redis
transport orders it: it keeps one list per step (``module.M``, ``module.M\\x06\\x163``, ``…6``, ``…9``) and
the agent's one BRPOP names them highest first, so no agent change and no extra round trip (a message without
a priority is 0, the first list). The embedded broker orders its message files by the same number
(:class:`contract.safe_transport.FilesystemChannel`). ``normal`` is the default; a run waiting longer than
``raise_after`` is raised a level at a time by the controller (:func:`raised`), so a ``low`` run is never
starved for more than three times that behind a stream of higher ones.
"""

from __future__ import annotations

from typing import Literal

Priority = Literal["urgent", "high", "normal", "low"]

#: name -> the broker's number (lower first); the steps of kombu's redis transport (``PRIORITY_STEPS``)
LEVELS: dict[str, int] = {"urgent": 0, "high": 3, "normal": 6, "low": 9}
NAMES: dict[int, str] = {n: name for name, n in LEVELS.items()}
DEFAULT: Priority = "normal"

# The controller's own message headers on a run's message (read by the controller's queue views and by the agent,
# which keeps them when it puts a run back on its queue): when it was sent (the controller's clock, seconds), the
# priority it was asked for (a name of LEVELS), and who started the run (a module another user reserved holds it).
SENT_AT = "fleet-sent-at"
ASKED = "fleet-priority"
USER = "fleet-user"
HEADERS = (SENT_AT, ASKED, USER)


def check_priority(name: str) -> Priority:
    """``name`` as a priority; ValueError naming the allowed ones otherwise."""
    if name not in LEVELS:
        raise ValueError(f"priority {name!r}: use one of {', '.join(LEVELS)}")
    return name  # type: ignore[return-value]


def level_of(number: object) -> str:
    """The name of a broker priority number (the step it falls in, as kombu files it); ``normal`` for none."""
    if not isinstance(number, int) or isinstance(number, bool):
        return "urgent" if number is None else DEFAULT
    steps = sorted(NAMES)
    below = [s for s in steps if s <= number]
    return NAMES[below[-1]] if below else NAMES[steps[0]]


def raised(name: str) -> str | None:
    """The level above ``name``; None for ``urgent`` and ``high`` (waiting runs are raised up to ``high``:
    ``urgent`` stays what a person asked for)."""
    order = list(LEVELS)
    i = order.index(name)
    return order[i - 1] if i >= 2 else None
