"""The HTTP API's bearer tokens file: read (refused unless only its owner can read it) and added to.

One token a line, ``#`` comments and blank lines ignored, mode 0600. ``fleetctl serve --new-token
--tokens FILE`` adds a fresh token to FILE (created, or rewritten, with mode 0600 in one rename):
``fleetctl serve --new-token > FILE`` made a file readable by others, which the API then refuses.
Standard library only: the file is written without the controller extras.
"""

from __future__ import annotations

import hmac
import secrets
import stat
from pathlib import Path

from contract.files import write_atomic
from controller.command import fleetctl
from controller.settings import ConfigError

MIN_TOKEN_LENGTH = 16


class TokenError(ConfigError):
    """The API's tokens file cannot be used (unreadable, readable by others, no token, a short one)."""


def _make_it(path: Path) -> str:
    return f"`{fleetctl('serve', '--new-token', '--tokens', str(path))}`"


class Tokens:
    """Bearer tokens from a file: one per line (``#`` comments, blank lines ignored). The file must
    not be readable by group or others. Checked in constant time against every token."""

    def __init__(self, tokens: list[str]) -> None:
        if not tokens:
            raise TokenError("no API token: the tokens file holds none")
        short = [t for t in tokens if len(t) < MIN_TOKEN_LENGTH]
        if short:
            raise TokenError(f"API tokens must be at least {MIN_TOKEN_LENGTH} characters ({len(short)} shorter)")
        self._tokens = [t.encode() for t in tokens]

    @classmethod
    def load(cls, path: Path) -> Tokens:
        try:
            st = path.stat()
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TokenError(f"{path}: cannot read the API tokens file: {exc.strerror or exc} (make one with "
                             f"{_make_it(path)})") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokenError(f"{path}: the API tokens file is readable by others (chmod 600 {path}; "
                             f"{_make_it(path)} writes it 0600)")
        return cls([ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")])

    def check(self, presented: str) -> bool:
        given = presented.encode()
        ok = False
        for t in self._tokens:  # every token compared: the time says nothing about which one matched
            ok |= hmac.compare_digest(t, given)
        return ok

    def __repr__(self) -> str:  # never print a token
        return f"Tokens({len(self._tokens)} tokens)"


def new_token() -> str:
    return secrets.token_hex(24)


def add_token(path: Path, token: str) -> int:
    """Append ``token`` to the tokens file at ``path`` (created if absent), which is left mode 0600 whatever
    it was; written to a temporary file and renamed (readers see the old file or the new one). The number of
    tokens it now holds."""
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise TokenError(f"API tokens are at least {MIN_TOKEN_LENGTH} characters, without spaces")
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        old = ""
    except OSError as exc:
        raise TokenError(f"{path}: cannot read the API tokens file: {exc.strerror or exc}") from None
    text = old + ("" if not old or old.endswith("\n") else "\n") + token + "\n"
    try:
        write_atomic(path, text, mode=0o600)
    except OSError as exc:
        raise TokenError(f"{path}: cannot write the API tokens file: {exc.strerror or exc}") from None
    return sum(1 for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))


__all__ = ["MIN_TOKEN_LENGTH", "TokenError", "Tokens", "add_token", "new_token"]
