"""The agent tests' hand-made release and its fixtures, for the pipeline-level telemetry tests."""

from tests.agent.conftest import (  # noqa: F401 - fixtures, registered by name
    make_config,
    make_request,
    model_root,
    no_leftovers,
    record_dir,
    release,
    tables,
)
from tests.report.conftest import reference, seed_rows  # noqa: F401, E402 - the seed as a baseline frame
