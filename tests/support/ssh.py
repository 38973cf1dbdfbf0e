"""The SSH tier's broker password and port, its lab's modules, a session's wheelhouse builder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from controller.inventory import Module
from controller.remote.deploy import DeployError, ModuleFacts, Wheelhouse, WheelhouseBuilder

if TYPE_CHECKING:
    from tests.ssh.netns import Lab

REDIS_PORT = 26379
REDIS_PASSWORD = "s3cret-Broker-pw"


def lab_modules(lab: Lab, **kw: Any) -> list[Module]:
    return [Module(name=h.name, host=h.address, ssh_user=h.user, **kw) for h in lab.hosts]


class CachedWheelhouse:
    """One WheelhouseBuilder for the session; a platform that cannot be fetched skips the test."""

    def __init__(self, builder: WheelhouseBuilder) -> None:
        self.builder = builder

    def __call__(self, facts: ModuleFacts) -> Wheelhouse:
        try:
            return self.builder(facts)
        except DeployError as exc:
            if "downloading wheels" in str(exc):
                pytest.skip(f"module wheels cannot be downloaded from the package index: {exc}")
            raise
