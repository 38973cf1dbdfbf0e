"""The environment a module measured in: one record per run and module, a short digest of it on every row.

Two modules, or one module on two days, differ by driver, firmware (MTBios), MUSA toolkit, torch_musa, Triton,
TileLang, kernel, OS and agent; a figure is only comparable with one measured in the same environment
(docs/adr/0021-environment-fingerprint.md). The agent gathers an :class:`EnvFingerprint` once per run
(:mod:`agent.env_probe`), sends it with the run's progress and stamps each row with its :meth:`digest`; the
controller stores the record once per run and module and compares digests.

The release's own version is kept in the record but is not part of the digest: it is what a comparison
compares, not the environment it was measured in.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

UNKNOWN = "unknown"  # a probe that failed: recorded as such, never guessed
# what the digest covers, in the order differences are named
COMPARED: tuple[str, ...] = ("driver", "firmware", "musa", "torch_musa", "triton", "tilelang", "kernel", "os",
                             "agent")
LABELS: dict[str, str] = {"driver": "driver", "firmware": "firmware (MTBios)", "musa": "MUSA", "torch_musa":
                          "torch_musa", "triton": "Triton", "tilelang": "TileLang", "kernel": "kernel", "os": "OS",
                          "agent": "agent"}
DIGEST_CHARS = 12


class EnvFingerprint(BaseModel):
    """What a module's figures were measured with (``"unknown"`` where a probe failed)."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # read by the other side (ADR 0051)

    driver: str = Field(default=UNKNOWN, max_length=200, description="device driver (the device tool's)")
    firmware: str = Field(default=UNKNOWN, max_length=200,
                          description="the cards' firmware (MTBios; VBIOS on NVIDIA), distinct values joined by ','")
    musa: str = Field(default=UNKNOWN, max_length=200, description="MUSA toolkit")
    torch_musa: str = Field(default=UNKNOWN, max_length=200, description="torch_musa in the release's Python")
    triton: str = Field(default=UNKNOWN, max_length=200, description="Triton in the release's Python")
    tilelang: str = Field(default=UNKNOWN, max_length=200, description="TileLang in the release's Python")
    kernel: str = Field(default=UNKNOWN, max_length=200, description="kernel (uname -r)")
    os: str = Field(default=UNKNOWN, max_length=200, description="OS (PRETTY_NAME of /etc/os-release)")
    agent: str = Field(default=UNKNOWN, max_length=200, description="m1000-fleet agent")
    release: str = Field(default="", max_length=200, description="the release measured (not in the digest)")

    def compared(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in COMPARED}

    def digest(self) -> str:
        """A short, stable digest of the compared fields (12 hex digits of sha256 over their canonical JSON)."""
        text = json.dumps(self.compared(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def differences(mine: EnvFingerprint, other: EnvFingerprint, other_is: str = "was") -> tuple[str, ...]:
    """What differs, in words: ``("driver 3.1.0 (was 3.0.0)",)`` (``other_is="fleet"``: ``(fleet 3.0.0)``),
    ordered as :data:`COMPARED`."""
    return tuple(f"{LABELS[k]} {getattr(mine, k)} ({other_is} {getattr(other, k)})" for k in COMPARED
                 if getattr(mine, k) != getattr(other, k))


def majority(prints: Iterable[EnvFingerprint]) -> EnvFingerprint | None:
    """The fingerprint most modules share (None: none, or no strict majority: a tie names nobody)."""
    counts = Counter(p.model_copy(update={"release": ""}) for p in prints)
    if not counts:
        return None
    (top, n), *rest = counts.most_common(2) + [(None, 0)]
    return top if top is not None and n > rest[0][1] else None
