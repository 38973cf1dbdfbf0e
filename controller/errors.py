"""The controller's one error root: what a user can cause, with the CLI's exit code and the API's HTTP status.

Every error the controller raises for a user to fix derives from :class:`FleetctlError` and
carries ``exit_code`` (what ``fleetctl`` exits with after its one line ``fleetctl: error: ...``)
and ``http_status`` (what the HTTP API answers, with ``{"detail": "<one line>"}``): class
attributes, overridden by a subclass or set on an instance. Anything else that reaches the CLI
or the API is a bug (a traceback; HTTP 500).

Errors of other packages that a user can cause enter the controller at too many points to
translate each one (an ``OSError`` on any path a user names, pydantic's ``ValidationError`` from
any model built from user values, the contract's ``SettingsError`` and ``UnknownModelKey``): they
are mapped here, once, by :func:`exit_code_of` and :func:`http_status_of` (the table
:func:`foreign_user_errors`).

Standard library only: ``fleetctl`` handles its errors without importing pandas or paramiko, and
the modules that define the subclasses import nothing heavy for it.

Lazy imports: :func:`foreign_user_errors` imports pydantic and the contract's records and settings when an
error is being handled. ``fleetctl --help`` imports this module but not pydantic (47 ms of CPU over a bare
``python -c pass``, ``bench/import_costs.py``: bench/results/import_costs_20261207_0346_lazy-libraries.txt;
the whole of ``fleetctl --help`` is ~0.14 s of CPU, ``bench/cli.py``).
"""

from __future__ import annotations

# the CLI's exit code of every user error (and of a bug: with its traceback)
EXIT_USER = 2


class FleetctlError(Exception):
    """Root of every error a user can cause in the controller (bad input by default: exit 2, HTTP 400)."""

    exit_code: int = EXIT_USER
    http_status: int = 400


def foreign_user_errors() -> tuple[tuple[type[BaseException], int | None, int | None], ...]:
    """Errors of other packages a user can cause: (type, CLI exit code, HTTP status), the first that
    matches wins; ``None``: on that side it is a bug. Imported only when an error is being handled."""
    from pydantic import ValidationError

    from contract.records import UnknownModelKey
    from contract.settings import SettingsError

    return (
        # the config file and FLEET_* variables; --models or "models"; a value out of bounds in a pydantic model
        (SettingsError, EXIT_USER, 400),
        (UnknownModelKey, EXIT_USER, 400),
        (ValidationError, EXIT_USER, 400),
        # a path the user named (the CLI runs as its user, on its files); on the API a failing OSError is
        # the server's own (its disk, its history): a 500
        (OSError, EXIT_USER, None),
        # a request's other ValueErrors (agent.errors.BadInput, a value a parser refused) are its input's
        # fault; on the CLI a ValueError that is not one of the above is a bug (traceback)
        (ValueError, None, 400),
    )


def _foreign(exc: BaseException) -> tuple[int | None, int | None]:
    for kind, exit_code, http_status in foreign_user_errors():
        if isinstance(exc, kind):
            return exit_code, http_status
    return None, None


def exit_code_of(exc: BaseException) -> int | None:
    """The CLI's exit code of an error the user can fix (shown as one line); None: a bug."""
    if isinstance(exc, FleetctlError):
        return exc.exit_code
    return _foreign(exc)[0]


def http_status_of(exc: BaseException) -> int | None:
    """The API's HTTP status of an error the request caused; None: a bug (500)."""
    if isinstance(exc, FleetctlError):
        return exc.http_status
    return _foreign(exc)[1]
