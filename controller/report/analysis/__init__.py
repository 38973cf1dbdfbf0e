"""The analysis behind a report: pure pandas, frames of result rows in, a :class:`Report` out.

One module per job: :mod:`.frame` (the rows encoded: codes, badness), :mod:`.groups` and
:mod:`.middles` (per-cell reductions, sorted once), :mod:`.stats` (sign and Wilcoxon tests; their null
distributions from ``scipy.special`` in :mod:`.nulls`),
:mod:`.outliers`, :mod:`.compare` (against the baseline / previous run), :mod:`.probe` (the
release against the agent's probe), :mod:`.summary`, :mod:`.verdict` (the regression policy,
in one file of plain code), :mod:`.build` (:func:`analyse`: the steps in order) and :mod:`.paired`
(two releases run A B B A on the same modules: ``fleetctl ab``).
"""

from __future__ import annotations

from controller.report.analysis.build import analyse
from controller.report.analysis.verdict import decide, fold

__all__ = ["analyse", "decide", "fold"]
