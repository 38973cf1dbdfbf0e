"""release_values is a view of _release_series (the change points' series): the same frame as its former
pandas melt/groupby computation, kept here as the reference, on random histories and a real one."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest

from controller.report.model import FLEET
from controller.report.trend import release_order, release_values


def reference_release_values(rows: pd.DataFrame, runs: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """release_values as it was computed before (pandas melt and group medians over the texts)."""
    rel = runs.set_index("run_id")["release"].astype(str)
    df = rows[rows["source"].astype(str) == "release"] if "source" in rows else rows
    df = df.assign(release=df["run_id"].astype(str).map(rel)).dropna(subset=["release"])
    keys = ["model_key", "profile", "run_id", "release"]
    long = df.melt(id_vars=[*keys, "module"], value_vars=list(metrics), var_name="metric").dropna(subset=["value"])
    long = long.astype({c: str for c in ("model_key", "profile", "run_id", "release", "module")})
    by = ["model_key", "profile", "metric", "run_id", "release"]
    fleet = long.groupby(by, observed=True)["value"].median().reset_index().assign(module=FLEET)
    per = pd.concat([fleet, long], ignore_index=True)
    return per.groupby(["model_key", "profile", "metric", "module", "release"], observed=True)["value"] \
        .median().reset_index()


METRIC_NAMES = ["decode_tps", "ttft_ms", "tpot_ms"]


def random_history(seed: int, *, categorical: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs of a few releases (some run twice, one without a release, a nightly name), rows of a few keys,
    profiles and modules; NaN values, rows of other sources and rows of runs not in ``runs``."""
    rng = np.random.default_rng(seed)
    releases = ["1.9.0", "1.10.0", "2.0rc1", "", "nightly-a", "1.10"][:rng.integers(2, 7)]
    n_runs = int(rng.integers(3, 12))
    runs = pd.DataFrame({"run_id": [f"run-{i}" for i in range(n_runs)],
                         "release": [releases[int(rng.integers(len(releases)))] for _ in range(n_runs)],
                         "created_at": rng.permutation(n_runs).astype(float) + 1000.0})
    n = int(rng.integers(20, 400))
    rows = pd.DataFrame({
        "run_id": rng.choice([*runs["run_id"], "run-gone"], n),
        "module": rng.choice(["m00", "m01", "m02", "m10"], n),
        "model_key": rng.choice(["qwen3", "llama", "a-b"], n),
        "profile": rng.choice(["short", "long"], n),
        "source": rng.choice(["release", "release", "release", "baseline", "jit"], n),
    })
    for m in METRIC_NAMES:
        v = rng.lognormal(3.0, 0.3, n)
        v[rng.random(n) < 0.2] = np.nan
        rows[m] = v
    if categorical:
        rows = rows.astype({c: "category" for c in ("run_id", "module", "model_key", "profile", "source")})
    return rows, runs


def check(rows: pd.DataFrame, runs: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    got, want = release_values(rows, runs, metrics), reference_release_values(rows, runs, metrics)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    return got


@pytest.mark.parametrize("seed", range(12))
def test_release_values_is_the_former_computation(seed):
    rows, runs = random_history(seed, categorical=seed % 3 == 0)
    got = check(rows, runs, METRIC_NAMES)
    assert len(got) and FLEET in set(got["module"])
    check(rows, runs, METRIC_NAMES[1:])
    check(rows.drop(columns="source"), runs, METRIC_NAMES)


def test_release_values_keeps_the_runs_without_a_release_and_drops_rows_of_unknown_runs():
    rows, runs = random_history(3)
    runs["release"] = ["", *["1.0.0"] * (len(runs) - 1)]
    got = check(rows, runs, METRIC_NAMES)
    assert "" in set(got["release"]) and "" not in release_order(runs)
    assert set(got["release"]) <= {"", "1.0.0"}


@pytest.mark.parametrize("column", ["module", "model_key", "profile", "run_id", "source"])
def test_release_values_leaves_out_rows_with_a_missing_key_as_before(column):
    """A row with a missing key is in no series. One difference: the former computation took a row without a
    module into its fleet medians (the change points' series never did); the store's rows always have one
    (``module`` is of the rows' primary key, a str in every ResultRow)."""
    for categorical in (False, True):
        rows, runs = random_history(2, categorical=categorical)
        rows = rows.astype({column: object})
        rows.loc[rows.index[::7], column] = np.nan
        if column == "module":
            got = release_values(rows, runs, METRIC_NAMES)
            assert not got.equals(reference_release_values(rows, runs, METRIC_NAMES))
            pd.testing.assert_frame_equal(got, reference_release_values(rows.dropna(subset=["module"]), runs,
                                                                        METRIC_NAMES), check_exact=True)
        else:
            check(rows, runs, METRIC_NAMES)
    rows, runs = random_history(4)
    runs = runs.astype({"release": object})
    runs.loc[0, "release"] = np.nan
    check(rows, runs, METRIC_NAMES)


def test_release_values_of_empty_frames():
    rows, runs = random_history(1)
    check(rows.iloc[:0], runs, METRIC_NAMES)
    check(rows, runs.iloc[:0], METRIC_NAMES)
    check(rows.assign(source="baseline"), runs, METRIC_NAMES)
    check(rows.assign(**{m: np.nan for m in METRIC_NAMES}), runs, METRIC_NAMES)
    check(rows, runs, [])


def test_release_values_of_a_stored_history(reference, tmp_path):
    from contract.records import METRICS
    from controller.report.load import history_frames
    from tests.support.trend import release_history

    h = release_history(tmp_path / "history.sqlite", reference, releases=5, regress={("qwen3", "decode_tps"): 0.10})
    try:
        rows, runs = history_frames(h)
        got = check(rows, runs, [m for m in METRICS if m in rows.columns])
        assert set(got["release"]) == {f"1.{i}.0" for i in range(5)}
    finally:
        h.close()


def test_history_sections_releases_are_those_of_the_former_values(reference, tmp_path):
    """Each drawn series' releases: those of its values in release order (formerly read from release_values'
    frame, a run without a release left out)."""
    from contract.records import METRICS
    from controller.report.load import history_frames
    from controller.report.trend import history_section, scope_of
    from tests.support.trend import release_history

    h = release_history(tmp_path / "history.sqlite", reference, regress={("qwen3", "decode_tps"): 0.10})
    try:
        rows, runs = history_frames(h)
    finally:
        h.close()
    extra = rows[rows["run_id"] == "run-11"].assign(run_id="run-x")  # a run without a release
    rows = pd.concat([rows, extra], ignore_index=True)
    runs = pd.concat([runs, pd.DataFrame({"run_id": ["run-x"], "release": [""], "created_at": [1e12]})],
                     ignore_index=True)
    sec = history_section(rows, runs, "1.11.0")
    assert sec.series
    order = release_order(runs)
    rank = {r: i for i, r in enumerate(order)}
    vals = reference_release_values(rows, runs, [m for m in METRICS if m in rows.columns])
    for s in sec.series:
        module = FLEET if s.scope == "fleet" else s.scope
        assert scope_of(module) == s.scope
        g = vals[(vals["model_key"] == s.model_key) & (vals["profile"] == s.profile) & (vals["metric"] == s.metric)
                 & (vals["module"] == module) & vals["release"].isin(rank)]
        assert s.releases == tuple(sorted(g["release"], key=rank.__getitem__)) and len(s.releases) == len(s.values)
