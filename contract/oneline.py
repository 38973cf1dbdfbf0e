"""One line for an error a person has to fix, the same on both sides of the fleet.

Lazy imports: pydantic is imported when an error is formatted: ``fleetctl --help`` imports this module and
not pydantic (47 ms CPU: ``bench/import_costs.py``, raw bench/results/import_costs_20261207_0346_lazy-libraries.txt).
"""

from __future__ import annotations


def error_line(exc: BaseException) -> str:
    """The error on one line; pydantic's validation errors: where and what of the first problem, and
    how many more."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError) and exc.error_count():
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"{where}: {first.get('msg')}{more}" if where else f"{first.get('msg')}{more}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
