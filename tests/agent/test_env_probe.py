"""The environment fingerprint: its parsers on recorded and published outputs, its digest, and gather with
probes that answer, fail or print nonsense (fast tier; one real Python run of the versions snippet)."""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from agent.env_probe import (
    VERSIONS_SNIPPET,
    clean,
    gather,
    os_name,
    parse_device,
    parse_versions,
    python_argv,
)
from contract.fingerprint import UNKNOWN, EnvFingerprint, differences, majority
from contract.version import agent_version

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PUBLISHED = (FIX / "mthreads" / "published" / "query-json-s5000.json").read_text()
MT_Q = (FIX / "mthreads" / "q.txt").read_text()
H200_Q = (FIX / "h200" / "nvidia-smi-q.txt").read_text()
ENV = {"MUSA_VERSION": "4.0.0", "TORCH_MUSA_VERSION": "2.1.0", "TRITON_VERSION": "3.1.0",
       "TILELANG_VERSION": "0.1.6"}


def test_driver_and_firmware_from_the_published_json() -> None:
    assert parse_device(PUBLISHED, None) == ("3.3.5-server", "4.3.41")


def test_driver_and_firmware_from_q_text_of_mthreads_gmi_and_nvidia_smi() -> None:
    assert parse_device(None, MT_Q) == ("3.0.0-server", "4.2.0")
    assert parse_device(None, H200_Q) == ("580.159.04", "96.00.A5.00.1A")
    assert parse_device("not json", MT_Q) == ("3.0.0-server", "4.2.0")
    assert parse_device(None, None) == (UNKNOWN, UNKNOWN)


def test_versions_from_the_snippet_else_the_release_variables_else_unknown() -> None:
    out = '{"torch_musa": "2.2.0", "tilelang": "0.1.7"}\n'
    assert parse_versions(out, ENV) == {"musa": "4.0.0", "torch_musa": "2.2.0", "triton": "3.1.0",
                                        "tilelang": "0.1.7"}
    assert parse_versions(None, {}) == dict.fromkeys(("musa", "torch_musa", "triton", "tilelang"), UNKNOWN)
    assert parse_versions("Traceback (most recent call last):", {"MUSA_VERSION": "4.0.0"})["musa"] == "4.0.0"
    assert parse_versions("[1]", {})["triton"] == UNKNOWN


def test_values_are_printable_and_bounded() -> None:
    assert clean("3.3.5\x1b[31m-server\n") == "3.3.5[31m-server"
    assert clean("N/A") == clean("  ") == UNKNOWN and len(clean("x" * 500)) == 200
    assert os_name('NAME="Debian"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n') == "Debian GNU/Linux 12 (bookworm)"
    assert os_name(None) == os_name("NAME=x") == UNKNOWN


class Probes:
    """Answers the probes from given outputs (None: the probe failed), recording what was asked."""

    def __init__(self, answers: Mapping[str, str | None]) -> None:
        self.answers = answers
        self.asked: list[list[str]] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        self.asked.append(list(argv))
        key = "python" if argv[1] == "-c" else " ".join(argv[1:])
        return self.answers.get(key)


def test_gather_asks_json_then_q_then_python(tmp_path: Path) -> None:
    osr = tmp_path / "os-release"
    osr.write_text('PRETTY_NAME="Test OS 1"\n')
    probes = Probes({"--query --json": None, "-q": MT_Q, "python": '{"triton": "3.2.0"}'})
    fp = gather(probes, ENV, tool="/usr/bin/mthreads-gmi", release="1.4.1", os_release=osr)
    assert fp == EnvFingerprint(driver="3.0.0-server", firmware="4.2.0", musa="4.0.0", torch_musa="2.1.0",
                                triton="3.2.0", tilelang="0.1.6", kernel=platform.release(), os="Test OS 1",
                                agent=agent_version(), release="1.4.1")
    assert [a[:2] for a in probes.asked] == [["/usr/bin/mthreads-gmi", "--query"], ["/usr/bin/mthreads-gmi", "-q"],
                                             ["python3", "-c"]]
    json_only = Probes({"--query --json": PUBLISHED})
    assert gather(json_only, {}, tool="gmi", release="r", os_release=osr).driver == "3.3.5-server"
    assert len(json_only.asked) == 2  # JSON answered: no -q


def test_every_probe_failing_leaves_unknown_and_no_tool_is_not_asked(tmp_path: Path) -> None:
    probes = Probes({})
    fp = gather(probes, {}, tool=None, release="1.4.1", os_release=tmp_path / "absent")
    assert (fp.driver, fp.firmware, fp.musa, fp.torch_musa, fp.triton, fp.tilelang, fp.os) == (UNKNOWN,) * 7
    assert fp.kernel == platform.release() and fp.release == "1.4.1"
    assert probes.asked == [python_argv({})]


def test_the_snippet_reads_package_metadata_and_the_musa_version_file(tmp_path: Path) -> None:
    (tmp_path / "version.txt").write_text("MUSA 4.0.1\nbuild 7\n")
    res = subprocess.run([sys.executable, "-c", VERSIONS_SNIPPET], capture_output=True, text=True, timeout=30,
                         env={"MUSA_HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    got = parse_versions(res.stdout, {})
    assert got["musa"] == "MUSA 4.0.1"
    assert got["torch_musa"] == got["tilelang"] == UNKNOWN  # not installed here


def test_the_digest_covers_the_environment_not_the_release() -> None:
    a = EnvFingerprint(driver="3.0.0", release="1.4.1")
    canonical = ('{"agent":"unknown","driver":"3.0.0","firmware":"unknown","kernel":"unknown","musa":"unknown",'
                 '"os":"unknown","tilelang":"unknown","torch_musa":"unknown","triton":"unknown"}')
    assert a.digest() == EnvFingerprint(driver="3.0.0", release="1.4.2").digest() == \
        hashlib.sha256(canonical.encode()).hexdigest()[:12] == "c860913e6a6b"
    b = a.model_copy(update={"driver": "3.1.0", "tilelang": "0.2"})
    assert b.digest() != a.digest() and len(b.digest()) == 12
    assert differences(b, a) == ("driver 3.1.0 (was 3.0.0)", "TileLang 0.2 (was unknown)")
    assert majority([a, a, b]) == a.model_copy(update={"release": ""})
    assert majority([a, b]) is None and majority([]) is None


def test_the_record_is_strict_in_its_values_and_reads_a_later_versions_fields() -> None:
    with pytest.raises(ValueError):
        EnvFingerprint.model_validate({"driver": "x" * 201})
    # a field of a later contract version is ignored by this reader (ADR 0051), not a refused progress
    assert EnvFingerprint.model_validate({"driver": "3.0.0", "extra": "field"}) == EnvFingerprint(driver="3.0.0")


def test_what_the_sampler_read_is_taken_and_the_tool_not_asked(tmp_path: Path) -> None:
    probes = Probes({"--query --json": PUBLISHED})
    fp = gather(probes, {}, tool="/usr/bin/mthreads-gmi", release="r", device=("3.1.0-sim", "4.2.0-sim"),
                os_release=tmp_path / "absent")
    assert (fp.driver, fp.firmware) == ("3.1.0-sim", "4.2.0-sim")
    assert probes.asked == [python_argv({})]
