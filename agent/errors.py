"""Exceptions of the agent: two roots, leaves that also inherit the built-in they resemble.

Input that cannot be used derives from :class:`contract.vocab.BadInput` (a ``ValueError``, shared with the
controller: the run id check raises it on both sides); every other error the agent raises on purpose from
:class:`AgentError`. Failures carry their result: a :class:`StepFailed` holds the :class:`StepError` record
(step, model key, exit code, tail of stderr) that ends up in the run's progress.
"""

from __future__ import annotations

from contract.records import StepError
from contract.vocab import BadInput as BadInput  # re-exported: the agent's own name for it


class AgentError(Exception):
    """Root of every error the agent raises on purpose, but for input that cannot be used (:class:`BadInput`)."""


class ChecksumMismatch(BadInput):
    pass


class EvictingBroker(BadInput):
    """The broker's Redis may evict keys (``maxmemory-policy``): the agent does not start (one line, the fix)."""


class UnsafeTarball(BadInput):
    pass


class StepFailed(AgentError, RuntimeError):
    """A step of the pipeline failed; ``error`` is what gets recorded."""

    def __init__(self, error: StepError) -> None:
        self.error = error
        super().__init__(error.one_line())


class Cancelled(AgentError):
    """The run was cancelled (between or within a step)."""

    def __init__(self, step: str, model_key: str | None = None) -> None:
        self.step = step
        self.model_key = model_key
        where = f"{step}[{model_key}]" if model_key else step
        super().__init__(f"cancelled during {where}")
