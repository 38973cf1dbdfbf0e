"""The API's routes of the fleet: modules and their state, reservations (list, make, end) and a module's power
(role ``admin``, as ``fleetctl devices power``: :mod:`controller.service.power`)."""

from __future__ import annotations

import logging
from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi import Path as PathParam

from controller import service
from controller.fleet.reservations import parse_duration
from controller.serve.access import may_act_on, refusal
from controller.serve.routes.common import ACT_ON, ADMIN, READS, TRIGGER, Pool, answer
from controller.serve.routes.models import (
    ERRORS,
    MAX_NAME,
    MAX_SELECTOR,
    Device,
    Problem,
    ReservationOut,
    ReserveBody,
    WireModel,
)
from controller.serve.tokens import Identity, Role
from controller.serve.wire import PREFIX
from controller.service.power import power_module
from controller.service.reservations import release, reservation_dict, reservations, reserve

log = logging.getLogger("fleet.api")

router = APIRouter()

ModuleName = Annotated[str, PathParam(min_length=1, max_length=128, description="the module's name")]


class PowerCommand(str, Enum):
    on = "on"
    off = "off"
    cycle = "cycle"


class Powered(WireModel):
    module: str
    command: PowerCommand
    line: str


@router.get(f"{PREFIX}/devices", response_model=list[Device], dependencies=READS, responses=ERRORS)
def list_devices(pool: Pool, devices: str = Query("all", min_length=1, max_length=MAX_SELECTOR,
                                                  description="'all', module names, label=value; comma separated")) \
        -> list[Device]:
    """Modules of the inventory and their state (idle, busy, offline, bad) from their heartbeats."""
    return [Device(**service.device_dict(d))
            for d in answer(lambda: service.devices(pool(), devices), devices)]


@router.get(f"{PREFIX}/reservations", response_model=list[ReservationOut], dependencies=READS, responses=ERRORS)
def list_reservations(pool: Pool,
                      devices: str = Query("all", min_length=1, max_length=MAX_SELECTOR,
                                           description="'all', module names, label=value; comma separated")) \
        -> list[ReservationOut]:
    """Modules reserved now: by whom, until when, why (``fleetctl reservations``)."""
    return [ReservationOut(**reservation_dict(r)) for r in answer(lambda: reservations(pool(), devices), devices)]


@router.post(f"{PREFIX}/reservations", status_code=201, response_model=list[ReservationOut],
             responses={**ERRORS, 409: {"model": Problem, "description": "another user holds one of the modules"}})
def create_reservation(body: ReserveBody, pool: Pool, who: Identity = Depends(TRIGGER)) -> list[ReservationOut]:
    """Reserve modules for the token's user (``fleetctl reserve``): no other user's run is sent to them until it
    ends; the user's own reservations are extended; 409 naming who holds one when another user does."""
    def make() -> list[Any]:
        try:
            seconds = parse_duration(body.duration)
        except ValueError as exc:
            raise service.BadRequest(str(exc)) from None
        return reserve(pool(), body.devices, seconds, body.reason, user=who.user)

    got = answer(make, body.devices, body.duration)
    log.info("%d module(s) reserved over HTTP by %s", len(got), who.user)
    return [ReservationOut(**reservation_dict(r)) for r in got]


@router.delete(f"{PREFIX}/reservations/{{module}}", response_model=ReservationOut, responses=ERRORS)
def delete_reservation(module: Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)], pool: Pool,
                       who: Identity = Depends(ACT_ON)) -> ReservationOut:
    """End a module's reservation: role trigger for the token's user's own, admin for another's."""
    def held() -> Any:
        if module not in {m.name for m in pool().inventory().modules}:
            raise service.NotFound(f"no module {module!r} in the inventory")
        found = reservations(pool(), module)
        if not found:
            raise service.NotFound(f"{module} is not reserved")
        return found[0]

    r = answer(held, module)
    if not may_act_on(who, r.user):
        raise HTTPException(403, refusal(who, Role.admin, f"releasing {module} (reserved by user {r.user})"))
    answer(lambda: release(pool(), module, user=who.user, force=True), module)
    log.info("%s: reservation of %s released over HTTP by %s", module, r.user, who.user)
    return ReservationOut(**reservation_dict(r))


@router.post(f"{PREFIX}/devices/{{module}}/power/{{command}}", response_model=Powered, responses={
    **ERRORS, 409: {"description": "another user reserved the module"},
    502: {"description": "the module's pdudaemon did not answer, or failed"}})
def power_device(module: ModuleName, command: PowerCommand, pool: Pool, who: Identity = Depends(ADMIN)) -> Powered:
    """Power a module on, off, or cycle it through its PDU (its inventory entry's pdudaemon outlet); refused
    for a module another user reserved; recorded in the history (``fleetctl devices power``)."""
    line = answer(lambda: power_module(pool(), module, command.value, user=who.user), module)
    log.info("%s over HTTP by %s", line, who.user)
    return Powered(module=module, command=command, line=line)
