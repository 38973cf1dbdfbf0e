"""``fleetctl devices power MODULE on|off|cycle``: a module's PDU outlet by hand, through pdudaemon, recorded.

Refused for a module another user holds (``fleetctl reserve``): their work runs there. Recorded as an event of the
module (who, what, the result), beside the cycles of the recovery policy (:mod:`controller.fleet.power`).
"""

from __future__ import annotations

from controller.remote.pdu import COMMANDS, PowerError, power
from controller.service.reservations import refused_for
from controller.service.session import BadRequest, Conflict, NotFound, Session

# the start of a module's event ``power cycle by alice: done (PDU ...)``
POWER_EVENT = "power"


def power_module(s: Session, name: str, command: str, *, user: str = "") -> str:
    """Do ``command`` (on, off, cycle) on module ``name``'s outlet as ``user`` (default: the session's); the line
    that says what was done. :class:`~controller.remote.pdu.PowerError` (recorded too) when pdudaemon did not."""
    if command not in COMMANDS:
        raise BadRequest(f"power command {command!r}: expected one of {', '.join(COMMANDS)}")
    mod = next((m for m in s.inventory().modules if m.name == name), None)
    if mod is None:
        raise NotFound(f"no module {name!r} in {s.settings.inventory}")
    if mod.power is None:
        raise BadRequest(f"{name} has no power entry in {s.settings.inventory} (power = {{ pdudaemon = URL, pdu = "
                         "NAME, port = PORT }): its outlet is not known")
    who = user or s.user
    held = refused_for(s, [name], who)
    if name in held:
        raise Conflict(f"{name} is {held[name]}: not powered {command} (their work runs there)")
    try:
        power(mod.power, command)
    except PowerError as exc:
        s.history().add_module_event(name, f"{POWER_EVENT} {command} by {who}: failed: {exc}")
        raise
    line = f"{name}: power {command} done ({mod.power.where()})"
    s.history().add_module_event(name, f"{POWER_EVENT} {command} by {who}: done ({mod.power.where()})")
    return line
