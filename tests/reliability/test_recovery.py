"""A module made bad by a real cause recovers once the cause is gone: its work folder (a small tmpfs)
falls below ``min_free_disk``, validations refused meanwhile are not failed runs of the module, and once
space is free again its next validation runs and passes. Real agent, real mount, real broker."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.records import RunState
from tests.support.tmpfs import mounted_tmpfs
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]


@pytest.fixture
def small_workdir(tmp_path: Path) -> Iterator[Path]:
    """sim-01's work folder on a 48 MiB tmpfs of its own (as tests/reliability/test_partition.py's)."""
    yield from mounted_tmpfs(tmp_path / "lab0" / "modules" / "sim-01" / "work", "size=48m")


def test_bad_for_low_disk_then_space_freed_takes_work_again(bench_factory, redis_broker, release, quick_release,
                                                          small_workdir):
    b = bench_factory(redis_broker)
    b.lab.start(sim_env={"sim-01": {"FLEET_MIN_FREE_DISK": str(16 * 1024**2)}})
    mods = b.lab.state().inventory().modules
    filler = small_workdir / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=40"], capture_output=True, check=True)
    wait_for(lambda: b.fleet.statuses(mods)["sim-01"].state == "bad", 20, "the module bad (low disk)")
    assert "free disk" in b.fleet.statuses(mods)["sim-01"].reason
    for i in range(4):  # each refused at dispatch: the run fails there, the module does not count it
        r = b.lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", "sim-01",
                           "--run-id", f"refused-{i}", "--detach")
        assert r.returncode in (0, 1), r.stderr
        p = b.history.progress(f"refused-{i}")["sim-01"]
        assert p.state == RunState.FAILED and p.error is not None
        assert p.error.message.startswith("module bad: free disk"), p.error.message
    filler.unlink()  # the cause is gone
    wait_for(lambda: b.fleet.statuses(mods)["sim-01"].state == "idle", 20, "the module idle again")
    d = b.lab.fleetctl("devices")
    assert "failed runs in a row" not in d.stdout, d.stdout
    run_id = b.validate(quick_release, models=("qwen3",))  # it takes work again (quick: its figures do not matter)
    view = b.check_run(run_id, 90)
    assert view.progress["sim-01"].state == RunState.DONE and view.state() == "done"
