"""The API's power route: ``POST /api/v1/devices/{module}/power/{command}`` (role ``admin``), as ``fleetctl devices
power`` does it (:mod:`controller.service.power`): refused (409) for a module another user reserved, 502 when the
module's pdudaemon did not do it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict

from controller.serve.access import RoleCheck
from controller.serve.tokens import Identity
from controller.serve.wire import PREFIX

log = logging.getLogger(__name__)

ModuleName = Annotated[str, PathParam(min_length=1, max_length=128, description="the module's name")]


class PowerCommand(str, Enum):
    on = "on"
    off = "off"
    cycle = "cycle"


class Powered(BaseModel):
    model_config = ConfigDict(extra="forbid")

    module: str
    command: PowerCommand
    line: str


def add_power_route(app: FastAPI, session: Callable[[], Any], errors: Callable[..., Any], admin: RoleCheck,
                    responses: dict[int | str, dict[str, Any]]) -> None:
    """The route on ``app`` (a route of its own, not an included router: the role checks walk ``app.routes``), over
    the API's sessions and its error mapping (``errors``)."""

    @app.post(f"{PREFIX}/devices/{{module}}/power/{{command}}", response_model=Powered, responses={
        **responses, 409: {"description": "another user reserved the module"},
        502: {"description": "the module's pdudaemon did not answer, or failed"}})
    def power_device(module: ModuleName, command: PowerCommand,
                     who: Identity = Depends(admin)) -> Powered:
        """Power a module on, off, or cycle it through its PDU (its inventory entry's pdudaemon outlet); refused
        for a module another user reserved; recorded in the history (``fleetctl devices power``)."""
        from controller.service.power import power_module

        line = errors(lambda: power_module(session(), module, command.value, user=who.user), module)
        log.info("%s over HTTP by %s", line, who.user)
        return Powered(module=module, command=command, line=line)
