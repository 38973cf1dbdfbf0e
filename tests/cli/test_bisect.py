"""``fleetctl bisect``: the releases it bisects (release order, from the good one to the bad one), and every bad
request refused in one line (exit 2) before anything is dispatched or recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.service.bisect import release_candidates
from controller.service.bisect_state import BisectStore
from controller.service.session import BadRequest
from tests.support.cli import one_line, run_main, write_release_stub

NAME = "SGLang-MUSA-M1000-M1000_{}_sglang.tar.gz"
VERSIONS = ["1.5.0.dev20261101", "1.5.0.dev20261102", "1.5.0.dev20261110", "1.5.0.dev20261103", "1.5.1"]


@pytest.fixture
def folder(env: Path) -> Path:
    d = env / "nightlies"
    d.mkdir()
    for v in VERSIONS:
        write_release_stub(d / NAME.format(v))
    (d / "README.txt").write_text("not a release\n")
    return d


def test_the_candidates_are_in_release_order_from_the_good_to_the_bad_one(folder: Path) -> None:
    got = release_candidates(str(folder), "1.5.0.dev20261102", "1.5.1")
    assert [c.version for c in got] == ["1.5.0.dev20261102", "1.5.0.dev20261103", "1.5.0.dev20261110", "1.5.1"]
    assert got[0].source == str(folder / NAME.format("1.5.0.dev20261102"))


def test_a_list_file_and_a_comma_list_name_the_releases_too(folder: Path, env: Path) -> None:
    paths = [str(folder / NAME.format(v)) for v in VERSIONS[:3]]
    listing = env / "releases.txt"
    listing.write_text("# nightlies\n" + "\n".join(paths) + "\n\n")
    by_file = release_candidates(str(listing), "1.5.0.dev20261101", "1.5.0.dev20261110")
    by_list = release_candidates(",".join(paths), "1.5.0.dev20261101", "1.5.0.dev20261110")
    assert [c.version for c in by_file] == [c.version for c in by_list] == VERSIONS[:3]


@pytest.mark.parametrize(("good", "bad", "says"), [
    ("1.5.1", "1.5.0.dev20261101", "--bad 1.5.0.dev20261101 does not come after --good 1.5.1 in release order"),
    ("1.4.9", "1.5.1", "--good 1.4.9: not among the 5 releases of --releases"),
])
def test_ends_out_of_order_or_unknown_are_refused(folder: Path, good: str, bad: str, says: str) -> None:
    with pytest.raises(BadRequest, match="^" + says.replace(".", r"\.") + "$"):
        release_candidates(str(folder), good, bad)


@pytest.mark.parametrize(("args", "says"), [
    (["--metric", "speed"], "--metric 'speed': not a metric (known: prefill_tps, ttft_ms, decode_tps, tpot_ms, "
                            "accept_rate, accept_rate_len, vision_fps, j_per_token, tokens_per_j, "
                            "server_ready_s, warmup_s, precompile_s, precompile_fetch_s)"),
    (["--tolerance", "1.5"], "--tolerance 1.5: give a fraction between 0 and 1 (0.01 = 1 %)"),
    (["--devices", "nope"], None),
    (["--models", "qwen9"], None),
])
def test_a_bad_option_is_one_line_and_nothing_is_recorded(env, folder, capsys, args, says) -> None:
    code, _, err = run_main(capsys, "bisect", "--good", "1.5.0.dev20261101", "--bad", "1.5.1", "--releases",
                            str(folder), "--models", "qwen3", *args)
    assert code == 2 and one_line(err).startswith("fleetctl: error: "), err
    if says is not None:
        assert one_line(err) == f"fleetctl: error: {says}"
    assert not (env / "history.sqlite").exists() and BisectStore(env / "fleet").list() == []


def test_resume_and_cancel_of_an_unknown_bisection_say_so(env, capsys) -> None:
    code, _, err = run_main(capsys, "bisect", "--resume", "bisect-20261202-120000-abcd")
    assert code == 2 and one_line(err) == (f"fleetctl: error: no bisection bisect-20261202-120000-abcd in "
                                           f"{env / 'fleet' / 'bisect'}")
    code, _, err = run_main(capsys, "bisect", "--cancel", "../../etc/passwd")
    assert code == 2 and "is not a bisection id" in one_line(err)


@pytest.mark.parametrize("args", [["--good", "1.5.0"], ["--good", "1.5.0", "--bad", "1.5.1", "--releases", "r"]])
def test_without_the_ends_models_or_an_id_it_says_what_to_give(env, capsys, args) -> None:
    """Issue 50: --models defaulted to all seven keys (a bisection's every round as long as a full validation);
    it is named now, as the docs show it."""
    code, _, err = run_main(capsys, "bisect", *args)
    assert code == 2 and one_line(err) == ("fleetctl: error: give --good, --bad, --releases and --models (or --resume "
                                           "ID, or --cancel ID)")
