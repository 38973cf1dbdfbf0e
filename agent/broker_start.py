"""Why ``fleet-agent worker`` could not start on its broker, in one line and a distinct exit status (issue 48, item 5).

Before the worker consumes anything it reads the broker (the eviction check, the claim of its module's name, the
recovery of its runs). A broker it cannot use there ended the agent with redis-py's traceback (47 to 86 lines),
every few seconds under the unit's restart. :func:`start_failure` (pure: the error and the broker's URL without its
password) names the cause and what to check; the agent prints it as ``error: ...`` and exits with its status:

====  ===========================================================================================
2     settings (a bad ``broker_url``: unsupported scheme, no host), or another live agent with the
      module's name, or an evicting broker (as before)
3     unreachable: nothing listening, no such host, the connection reset or timed out
4     credentials refused: wrong password or user (``broker_password_file``, the broker's ACL file)
5     TLS failed: a certificate not trusted (``broker_tls_ca_file``), a client certificate refused,
      ``rediss://`` to a port without TLS
6     refused by the broker's ACL: the user may not run a command or reach a key the agent needs
      (another module's user, an ACL file older than the agent)
====  ===========================================================================================

No password is in the line: redis-py's messages carry none, and the URL is the redacted one.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from contract.oneline import error_line

EXIT_UNREACHABLE = 3
EXIT_CREDENTIALS = 4
EXIT_TLS = 5
EXIT_ACL = 6

_AUTH_WORDS = ("WRONGPASS", "NOAUTH", "invalid username-password", "invalid password", "AUTH <password> called")
_TLS_WORDS = ("[SSL", "SSL:", "certificate", "TLS", "wrong version number")
_RESET_WORDS = ("reset by peer", "Connection closed by server", "Broken pipe")


@dataclass(frozen=True)
class StartFailure:
    code: int
    line: str


def _chain(exc: BaseException) -> list[BaseException]:
    """The error and those it was raised from or while handling (kombu wraps redis', redis-py wraps ssl's)."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out and len(out) < 8:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def start_failure(exc: BaseException, where: str) -> StartFailure | None:
    """The one line and exit status of a broker the agent could not start on (``where``: its redacted URL), or
    None when ``exc`` is not the broker's (a bug: its traceback is kept)."""
    from redis import exceptions as rx

    chain = _chain(exc)
    text = " | ".join(error_line(e) for e in chain)
    msg = error_line(next((e for e in chain if isinstance(e, rx.RedisError)), exc))

    def any_of(*kinds: type[BaseException]) -> bool:
        return any(isinstance(e, kinds) for e in chain)

    if any_of(rx.NoPermissionError) or "NOPERM" in text:
        return StartFailure(EXIT_ACL, f"broker {where} refused a command to this user (ACL): {msg}; the module's "
                                      "broker user needs the rights `fleetctl broker acl` writes for this module "
                                      "(is it another module's user, or an ACL file older than this agent?)")
    if any_of(rx.AuthenticationError, rx.AuthenticationWrongNumberOfArgsError) or any(w in text for w in _AUTH_WORDS):
        return StartFailure(EXIT_CREDENTIALS, f"broker {where} refused the credentials ({msg}); check the user in "
                                              "broker_url and the password in broker_password_file (and the "
                                              "broker's users.acl)")
    if any_of(ssl.SSLError) or any(w in text for w in _TLS_WORDS):
        return StartFailure(EXIT_TLS, f"broker {where}: TLS failed ({msg}); check broker_tls_ca_file (the CA that "
                                      "signed the broker's certificate), broker_tls_cert_file/broker_tls_key_file, "
                                      "and rediss:// only for a TLS port")
    from kombu.exceptions import OperationalError

    if any_of(rx.ConnectionError, rx.TimeoutError, OperationalError, OSError):
        hint = (" (a TLS-only port spoken to without TLS? then use rediss:// and the broker_tls_* files)"
                if any(w in text for w in _RESET_WORDS) else "")
        return StartFailure(EXIT_UNREACHABLE, f"broker {where} unreachable ({msg}){hint}; is the broker running "
                                              "there, and are broker_url's host and port right?")
    return None
