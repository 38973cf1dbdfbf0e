"""Environment fingerprints in reports (pure): modules whose environment is not the fleet's, and what changed
against the run a report compares with.

Each row carries the digest of the environment it was measured in (``ResultRow.env_digest``; the records:
:class:`contract.fingerprint.EnvFingerprint`, one per run and module in the history). A report names every
module whose environment differs from the one most modules share (and says so next to an outlier: a driver
difference, not the module, may be why it is slow), and warns when a module (or, with no module in common, the
fleet) measured in another environment than its reference (baseline, previous run, the other run of
``fleetctl compare``). With ``same_environment`` (``ControllerSettings.baseline_same_environment``) a baseline
measured in another environment, or in an unknown one, is refused (:class:`EnvironmentRefused`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pandas as pd

from contract.fingerprint import EnvFingerprint, differences, majority
from contract.records import RunProgress
from controller.report.model import FLEET, EnvDifference, Report, ReportError


class EnvironmentRefused(ReportError):
    """A baseline comparison that requires the same environment, against a baseline measured in another one."""


def digests_of(rows: pd.DataFrame | None) -> dict[str, str]:
    """module -> the environment digest most of its rows carry (modules whose rows have none left out)."""
    if rows is None or not len(rows) or "env_digest" not in rows.columns:
        return {}
    has = rows["env_digest"].notna().to_numpy()
    # rows from before fingerprints (or a seed baseline): nothing to compare, nothing converted
    if not has.any():
        return {}
    # codes, not strings (a report reads a million rows as categoricals): one bincount over (module, digest) pairs
    mods, mod_names = pd.factorize(rows["module"][has], sort=True)
    digs, dig_names = pd.factorize(rows["env_digest"][has], sort=True)
    counts = np.bincount(mods * len(dig_names) + digs, minlength=len(mod_names) * len(dig_names))
    best = counts.reshape(len(mod_names), len(dig_names)).argmax(axis=1)  # a tie: the first digest in order
    return {str(m): str(dig_names[b]) for m, b in zip(mod_names, best, strict=True)}


def fleet_odd(prints: Mapping[str, EnvFingerprint]) -> tuple[EnvDifference, ...]:
    """Modules whose environment differs from the one most modules share (none without a strict majority)."""
    major = majority(prints.values())
    if major is None:
        return ()
    share = sum(1 for p in prints.values() if p.digest() == major.digest())
    return tuple(EnvDifference(module=m, digest=p.digest(), differences=differences(p, major, "fleet"),
                               fleet_modules=len(prints), majority_modules=share)
                 for m, p in sorted(prints.items()) if p.digest() != major.digest())


def changes(current: Mapping[str, EnvFingerprint], reference: Mapping[str, EnvFingerprint],
            label: str) -> tuple[str, ...]:
    """Warnings, one per module measured in another environment than in ``reference`` (``label``); with no module
    in common, one for the fleet's majority environments."""
    shared = sorted(set(current) & set(reference))
    if shared:
        return tuple(f"environment changed on {m} since {label}: {'; '.join(differences(current[m], reference[m]))}"
                     for m in shared if current[m].digest() != reference[m].digest())
    now, then = majority(current.values()), majority(reference.values())
    if now is None or then is None or now.digest() == then.digest():
        return ()
    return (f"the fleet's environment differs from {label}'s: {'; '.join(differences(now, then))}",)


def refuse_unless_same(current: Mapping[str, str], reference: Mapping[str, str],
                       prints: Mapping[str, EnvFingerprint], label: str) -> None:
    """Raise :class:`EnvironmentRefused` unless every module shared with the baseline (none shared: every module)
    measured in the baseline's environment; digests map to records through ``prints``."""
    if not reference:
        raise EnvironmentRefused(f"baseline {label} has no environment fingerprint and "
                                 "baseline_same_environment is set: compare against a baseline measured with one")
    shared = sorted(set(current) & set(reference)) or sorted(current)
    ref_all = set(reference.values())
    for m in shared:
        mine = current[m]
        ref = {reference[m]} if m in reference else ref_all
        if mine not in ref:
            now, then = prints.get(mine), prints.get(sorted(ref)[0])
            what = "; ".join(differences(now, then)) if now and then else f"digest {mine} vs {', '.join(sorted(ref))}"
            raise EnvironmentRefused(f"{m} measured in another environment than baseline {label} ({what}) and "
                                     "baseline_same_environment is set: compare against a baseline of this environment")


def with_environment(report: Report, prints: Mapping[str, EnvFingerprint],
                     references: Mapping[str, Mapping[str, EnvFingerprint]] | None = None) -> Report:
    """The report with its modules off the fleet's environment (a note each, said of an outlier too) and a
    warning per reference (label -> module -> record) measured in another environment."""
    odd = fleet_odd(prints)
    notes = [f"{d.module}'s environment differs from the fleet's ({d.majority_modules} of {d.fleet_modules} "
             f"modules): {'; '.join(d.differences)}" for d in odd]
    outliers = {o.module for o in report.outliers}
    notes += [f"outlier {d.module} was measured in another environment than the fleet's ({'; '.join(d.differences)}):"
              " that, not the module, may be why it is out of line" for d in odd if d.module in outliers]
    warnings = tuple(w for label, ref in (references or {}).items() if ref for w in changes(prints, ref, label))
    if not odd and not warnings:
        return report
    return dataclasses.replace(report, environment=odd, environment_changes=warnings,
                               notes=report.notes + tuple(notes) + warnings)


def environment_text(report: Report, module: str) -> str:
    """An outlier's environment in words, when it is not the fleet's ('' when it is, or is unknown)."""
    if module == FLEET:
        return ""
    d = next((x for x in report.environment if x.module == module), None)
    return "" if d is None else f"other environment than the fleet: {'; '.join(d.differences)}"


def kernel_cache_note(progress: Mapping[str, RunProgress]) -> str | None:
    """Which modules compiled the release's kernels, which fetched them from the fleet's kernel cache and which had
    them cached from an earlier run (None: no module of the run used the shared cache)."""
    used = {m: p.kernel_cache for m, p in progress.items() if p.kernel_cache is not None}
    if not used:
        return None
    compiled = sorted(m for m, u in used.items() if u.action == "compiled")
    published = sorted(m for m in compiled if used[m].published)
    fetched = sorted(m for m, u in used.items() if u.action == "fetched")
    before = sorted(m for m, p in progress.items() if p.kernel_cache is None and p.precompile_cached)
    parts = [f"compiled on {', '.join(compiled)}" + (f" (published by {', '.join(published)})" if published else "")
             ] if compiled else []
    parts += [f"fetched on {', '.join(fetched)}"] if fetched else []
    parts += [f"cached by an earlier run on {', '.join(before)}"] if before else []
    # a module that compiled because the store's archive was refused (corrupt, replaced, too large) says why
    parts += [f"{m} compiled because the store's {used[m].why}" for m in compiled if "refused" in used[m].why]
    return "kernel cache: " + "; ".join(parts)
