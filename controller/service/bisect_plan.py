"""The pure part of ``fleetctl bisect``: which candidates a round measures, how a candidate is called, what the
answer is. No I/O: :mod:`controller.service.bisect` runs the rounds.

**Candidates** are the releases in release order, the known-good one first (index 0) and the known-bad one last.
A candidate's **call** is ``good``, ``bad``, ``skip`` (it could not be measured: ``git bisect skip``) or ``None``
(not measured yet). The first bad release is the lowest index called bad above the highest good below it.

**k-ary rounds** (:func:`next_probes`): with ``k`` idle modules a round measures ``k`` candidates at once. The
answer is one of the ``u`` untested candidates between the last good and the first bad, or that first bad itself:
``u + 1`` possibilities; ``k`` probes placed at every ``(u + 1) / (k + 1)``-th of them cut those into ``k + 1``
equal parts, so ``ceil(log_(k+1)(u + 1))`` rounds name it (:func:`rounds_needed`; one module: binary search).

**A candidate's call** (:func:`call_of`) is made on each target (model key, metric) of the bisection, the
regressions the bad release shows against the good one on these modules: where the candidate's paired change
against the good release (same module) sits between 0 (as good) and the bad release's change (as bad). Past the
middle it is bad. When the change's 95 % interval straddles the middle, the call is ``unsure`` and the candidate
is measured again (up to :data:`MAX_MEASURES` times, the measurements pooled); after that, its estimate decides.
A candidate is bad when any target is bad, good when every target is good.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from controller.service.session import BadRequest

Call = Literal["good", "bad", "skip"]
TargetCall = Literal["good", "bad", "unsure"]
# measurements of one candidate before its estimate alone decides
MAX_MEASURES = 3


class BisectPlanError(BadRequest):
    """The candidates cannot be bisected (the calls contradict the endpoints)."""


@dataclass(frozen=True)
class Bounds:
    """Where the answer lies: ``good`` the last good index below ``bad``, the first bad index; ``untested`` the
    indices between them not measured yet; ``skipped`` those between them that could not be measured."""

    good: int
    bad: int
    untested: tuple[int, ...]
    skipped: tuple[int, ...]

    @property
    def done(self) -> bool:
        return not self.untested

    @property
    def suspects(self) -> tuple[int, ...]:
        """When done: the candidates that may be the first bad one (the skipped ones between, then ``bad``)."""
        return (*self.skipped, self.bad)


def bounds(calls: Sequence[Call | None]) -> Bounds:
    """The interval the answer lies in (see the module's docstring). ``calls[0]`` must be good, ``calls[-1]`` bad."""
    if len(calls) < 2 or calls[0] != "good" or calls[-1] != "bad":
        raise BisectPlanError("the first candidate must be the good release and the last the bad one")
    bad = min(i for i, c in enumerate(calls) if c == "bad")
    good = max(i for i, c in enumerate(calls[:bad]) if c == "good")
    between = range(good + 1, bad)
    return Bounds(good=good, bad=bad, untested=tuple(i for i in between if calls[i] is None),
                  skipped=tuple(i for i in between if calls[i] == "skip"))


def still_open(indices: Sequence[int], b: Bounds | None) -> tuple[int, ...]:
    """The candidates among ``indices`` whose call can still move the answer: strictly between the last good and
    the first bad one. A candidate a round's other calls put outside (its module lost, or its call unsure, while a
    neighbour was called) is not measured again."""
    return tuple(indices) if b is None else tuple(i for i in indices if b.good < i < b.bad)


def next_probes(calls: Sequence[Call | None], k: int) -> tuple[int, ...]:
    """The candidates the next round measures with ``k`` modules: at most ``k``, evenly over the answer's
    ``u + 1`` possibilities (none when the answer is known)."""
    if k < 1:
        raise BisectPlanError("a round needs at least one module")
    untested = bounds(calls).untested
    u = len(untested)
    k = min(k, u)
    # probe j at the (j (u+1) / (k+1))-th possibility: parts of equal size (rounded), each probe the last of one
    picks = sorted({min(u - 1, max(0, round(j * (u + 1) / (k + 1)) - 1)) for j in range(1, k + 1)})
    return tuple(untested[p] for p in picks)


def rounds_needed(between: int, k: int) -> int:
    """Rounds to name the first bad release among ``between`` untested candidates (plus the known bad one) with
    ``k`` modules, in the worst case (no skips, no re-measures)."""
    if k < 1:
        raise BisectPlanError("a round needs at least one module")
    rounds, left = 0, between + 1
    while left > 1:
        left = math.ceil(left / (k + 1))
        rounds += 1
    return rounds


@dataclass(frozen=True)
class Target:
    """One regression the bisection follows: the bad release's paired change on (model key, metric)."""

    model_key: str
    metric: str
    # relative, B / A - 1, in the metric's own direction (-0.08: decode 8 % slower)
    bad_change: float


@dataclass(frozen=True)
class Measured:
    """A candidate's paired change against the good release on one target, with its 95 % interval (None: too few
    profiles for one)."""

    change: float
    ci_low: float | None
    ci_high: float | None


def target_call(t: Target, m: Measured, *, final: bool = False) -> TargetCall:
    """``bad`` past the middle between the good release (0) and the bad one, ``good`` before it; ``unsure`` when
    the interval straddles the middle (unless ``final``: then the estimate decides)."""
    middle = t.bad_change / 2
    side = 1.0 if t.bad_change > 0 else -1.0
    past = (m.change - middle) * side >= 0
    if not final and m.ci_low is not None and m.ci_high is not None and m.ci_low <= middle <= m.ci_high:
        return "unsure"
    return "bad" if past else "good"


def call_of(calls: Sequence[TargetCall]) -> TargetCall:
    """A candidate over its targets: bad when any is bad, good when all are good, else unsure."""
    if "bad" in calls:
        return "bad"
    return "good" if calls and all(c == "good" for c in calls) else "unsure"
