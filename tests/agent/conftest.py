"""Fixtures of the agent's tests: a hand-made release (shell scripts, seed tables), model folders, ports
(defined in tests/support/agent_release.py, shared with the telemetry tests)."""

from tests.support.agent_release import (  # noqa: F401 - fixtures, registered by name
    make_config,
    make_request,
    model_root,
    no_leftovers,
    record_dir,
    release,
    tables,
)
