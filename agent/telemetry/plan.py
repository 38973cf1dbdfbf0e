"""Pure planner of the device tool's command lines: which tool, which argv, which fields.

First ``<tool> --query --json`` (:meth:`QueryPlan.json_argv`: what published ``mthreads-gmi``
output comes from); a tool that refuses it or answers something else (``nvidia-smi``) is asked
the way ``nvidia-smi`` is, which ``mthreads-gmi`` is said to follow too:
``<tool> --query-gpu=<fields> --format=csv,noheader,nounits``, and ``<tool> -q`` for the
fields the query interface lacks. A tool that refuses a field name (``Field "x" is not a
valid field to query``) fails the whole query; :meth:`QueryPlan.refuse` gives the plan
without that name (its next spelling, or without the field), so one unknown field never
costs the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from agent.telemetry.fields import FIELDS, FieldSpec
from agent.telemetry.gmi_json import JSON_FLAGS

TOOLS: tuple[str, ...] = ("mthreads-gmi", "nvidia-smi")  # looked up in this order on PATH
FORMAT = "--format=csv,noheader,nounits"


def choose_tool(configured: str | None, which: Callable[[str], str | None]) -> str | None:
    """The tool to run: the configured one (a name looked up on PATH, or a path), else the first of
    :data:`TOOLS` on PATH; None when there is none."""
    if configured:
        if os.sep in configured:
            return configured if os.access(configured, os.X_OK) else None
        return which(configured)
    for name in TOOLS:
        found = which(name)
        if found:
            return found
    return None


@dataclass(frozen=True)
class QueryPlan:
    """The columns asked of ``--query-gpu`` and the name each is asked by."""

    tool: str
    columns: tuple[FieldSpec, ...]
    # an index into each column's ``queries``; the fields the tool refused under every name
    choice: tuple[int, ...]
    dropped: tuple[str, ...] = ()

    @classmethod
    def initial(cls, tool: str, fields: tuple[FieldSpec, ...] = FIELDS) -> QueryPlan:
        if not fields or fields[0].name != "gpu":
            raise ValueError("the device index must be the first field")
        return cls(tool, fields, (0,) * len(fields))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.queries[i] for spec, i in zip(self.columns, self.choice, strict=True))

    def argv(self) -> list[str]:
        return [self.tool, f"--query-gpu={','.join(self.names)}", FORMAT]

    def json_argv(self) -> list[str]:
        return [self.tool, *JSON_FLAGS]

    def q_argv(self) -> list[str]:
        return [self.tool, "-q"]

    def refuse(self, query_name: str) -> QueryPlan | None:
        """The plan without ``query_name``: the field's next spelling, else without the field.

        None when the name is not asked for, or it is the device index (nothing to sample then).
        """
        names = self.names
        if query_name not in names:
            return None
        i = names.index(query_name)
        spec = self.columns[i]
        if spec.name == "gpu":
            return None
        if self.choice[i] + 1 < len(spec.queries):
            choice = self.choice[:i] + (self.choice[i] + 1,) + self.choice[i + 1:]
            return QueryPlan(self.tool, self.columns, choice, self.dropped)
        return QueryPlan(self.tool, self.columns[:i] + self.columns[i + 1:], self.choice[:i] + self.choice[i + 1:],
                         self.dropped + (spec.name,))
