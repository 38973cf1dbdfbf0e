"""The agent tests' hand-made release and its fixtures, for the pipeline-level telemetry tests."""

from tests.support.agent_release import (  # noqa: F401 - fixtures, registered by name
    make_config,
    make_request,
    model_root,
    no_leftovers,
    record_dir,
    release,
    tables,
)
from tests.support.frames import reference, seed_rows  # noqa: F401 - the seed as a baseline frame
