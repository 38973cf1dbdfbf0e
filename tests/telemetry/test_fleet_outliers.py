"""End to end on a simulated fleet (real agent workers, simulated release, servers and device tools,
embedded broker): one module slow because its device throttles, one slow for no visible reason on its
device but with another driver. The report names both; it explains the first by its clock, finds nothing on
the second's device and names its driver (slow tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller import service
from controller.cli.demo import inventory_toml, module_names, reference_rows, simulated_fleet
from controller.report import build_report
from controller.report.render import verdict_line
from controller.settings import ControllerSettings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_throttled_module_is_explained_by_its_clock(tmp_path: Path) -> None:
    import simulator

    names = module_names(6)
    throttled, slow = names[3], names[5]
    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  inventory=tmp_path / "inventory.toml", history=tmp_path / "history.sqlite",
                                  heartbeat_interval=1.0, offline_after=20.0)
    (tmp_path / "inventory.toml").write_text(inventory_toml(names, tmp_path, None), encoding="utf-8")
    rel = simulator.build_release(tmp_path / "release", noise=0.02, time_scale=50.0, seed=5)
    st = service.Session(settings)
    try:
        st.history().add_baseline(rel.version, reference_rows(), "simulator reference tables")
        with simulated_fleet(names, tmp_path, settings, noise=0.02, seed=5, slow={slow: 1.12},
                             device={throttled: "throttle:0.88"}, env={slow: {simulator.ENV_DRIVER: "3.1.0-sim"}}):
            launched = service.validate(st, service.ValidateRequest(release=rel.path, models=("qwen3",)))
            service.follow(st, launched.run_id, timeout=300)
            service.judge(st, launched.run_id)
        rep = build_report(st.history(), "latest")
        assert {(o.module, o.model_key) for o in rep.outliers} == {(throttled, "*"), (slow, "*")}, verdict_line(rep)
        t = {x.module: x for x in rep.outlier_telemetry}
        assert t[throttled].status == "explained", t[throttled]
        assert t[throttled].findings[0].startswith("SM clock \u221212 %"), t[throttled].findings
        assert any("HW Slowdown" in f for f in t[throttled].findings)
        assert t[slow].status == "nothing unusual", t[slow]
        assert [(d.module, d.differences) for d in rep.environment] == [(slow, ("driver 3.1.0-sim (fleet 3.0.0-sim)",))]
        assert (f"outlier {slow} was measured in another environment than the fleet's (driver 3.1.0-sim (fleet "
                "3.0.0-sim)): that, not the module, may be why it is out of line") in rep.notes
        prints = st.history().fingerprints(rep.run_id)
        assert set(prints) == set(names) and prints[names[0]].tilelang == "0.1.6-sim"
        summaries = st.history().telemetry(rep.run_id)
        assert set(summaries) == set(names) and all(s.tool == "mthreads-gmi" for s in summaries.values())
        busy = summaries[names[0]].for_key("qwen3")[0]
        assert busy.fields["sm_clock_mhz"].max == 1800 and busy.fields["utilization_pct"].max > 50
    finally:
        st.close()
