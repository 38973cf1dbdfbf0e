"""The HTTP API's bearer tokens file: parsed (refused unless only its owner can read it) and added to.

Two formats (ADR 0026). Version 2, what ``fleetctl serve --new-token --tokens FILE`` writes: a first line
``# m1000-fleet tokens v2``, then one token a line as ``USER ROLE TOKEN`` (``#`` comments and blank lines
ignored), each token a named user's, with a role: ``read`` < ``trigger`` < ``admin``. Version 1, the old
flat file: one token a line, each read as a user ``token-N`` (N its place in the file) with role
``admin`` (what every token could do before roles), and a warning saying how to upgrade. A line of a
file without the v2 first line that holds a space is refused: a v2 file that lost its first line would
otherwise make every ``USER ROLE TOKEN`` line one admin token.

The file must be mode 0600. ``--new-token --tokens FILE`` adds a token to FILE (created, or rewritten, with
mode 0600 in one rename; a v1 file is rewritten as v2, its tokens kept as ``token-N admin``).
Standard library only: the file is written without the controller extras.
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from contract.files import write_atomic
from controller.command import fleetctl
from controller.settings import ConfigError

MIN_TOKEN_LENGTH = 16
V2_HEADER = "# m1000-fleet tokens v2"
USER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")

log = logging.getLogger("fleet.api")


class TokenError(ConfigError):
    """The API's tokens file cannot be used (unreadable, readable by others, no token, a short one, a bad line)."""


class Role(str, Enum):
    """What a token's user may do on the API; each role may do what the ones before it may."""

    # runs, reports, trend, devices
    read = "read"
    # also start, resume, retry runs, and cancel its own
    trigger = "trigger"
    # also act on others' work: cancel another user's run, release another's reservation, reset modules
    admin = "admin"

    @property
    def rank(self) -> int:
        return list(Role).index(self)

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


@dataclass(frozen=True)
class Identity:
    """Who a token belongs to, and the role it gives."""

    user: str
    role: Role


@dataclass(frozen=True)
class TokenEntry:
    """One line of a tokens file. ``line``: its line number (1-based), for errors."""

    identity: Identity
    token: str = ""
    line: int = 0

    def __repr__(self) -> str:  # never print a token
        return f"TokenEntry({self.identity.user!r}, {self.identity.role.value}, line {self.line})"


@dataclass(frozen=True)
class TokensFile:
    """A parsed tokens file: its format version and its entries (pure)."""

    version: int
    entries: tuple[TokenEntry, ...]


def check_user(name: str) -> str:
    """A user name as a tokens file and a run record hold it: 1-64 of letters, digits, ``._@-``, no space."""
    if not USER_PATTERN.fullmatch(name):
        raise TokenError(f"user name {name[:64]!r}: 1-64 letters, digits or ._@- (starting with a letter or digit)")
    return name


def parse_role(text: str) -> Role:
    try:
        return Role(text)
    except ValueError:
        raise TokenError(f"role {text[:32]!r}: one of {', '.join(r.value for r in Role)}") from None


def parse_tokens(text: str, source: Path | str) -> TokensFile:
    """The entries of a tokens file's ``text`` (pure); a bad line is a :class:`TokenError` naming ``source`` and
    its line number. A token given twice is refused (which line wins would be a guess), and so is a user given
    two roles (a user has one role)."""
    lines = text.splitlines()
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    version = 2 if first == V2_HEADER else 1
    entries: list[TokenEntry] = []
    seen: dict[str, int] = {}
    roles: dict[str, tuple[Role, int]] = {}
    for no, raw in enumerate(lines, 1):
        ln = raw.strip()
        if not ln or ln.startswith("#"):
            continue
        where = f"{source}:{no}"
        fields = ln.split()
        if version == 1:
            if len(fields) != 1:
                raise TokenError(f"{where}: a token with a space in a file without the first line {V2_HEADER!r} "
                                 "(a v2 file's lines are USER ROLE TOKEN; a v1 file's one token each)")
            entry = TokenEntry(Identity(f"token-{len(entries) + 1}", Role.admin), ln, no)
        else:
            if len(fields) != 3:
                raise TokenError(f"{where}: {len(fields)} fields; a line is USER ROLE TOKEN")
            user, role_text, token = fields
            try:
                entry = TokenEntry(Identity(check_user(user), parse_role(role_text)), token, no)
            except TokenError as exc:
                raise TokenError(f"{where}: {exc}") from None
            known = roles.setdefault(user, (entry.identity.role, no))
            if known[0] is not entry.identity.role:
                raise TokenError(f"{where}: user {user} has role {known[0].value} on line {known[1]} and "
                                 f"{entry.identity.role.value} here (one role a user)")
        if len(entry.token) < MIN_TOKEN_LENGTH:
            raise TokenError(f"{where}: API tokens must be at least {MIN_TOKEN_LENGTH} characters")
        if entry.token in seen:
            raise TokenError(f"{where}: the same token as line {seen[entry.token]} (each token once)")
        seen[entry.token] = no
        entries.append(entry)
    return TokensFile(version, tuple(entries))


def _make_it(path: Path) -> str:
    return f"`{fleetctl('serve', '--new-token', '--tokens', str(path))}`"


def upgrade_hint(path: Path) -> str:
    return (f"{path}: API tokens file of the old flat format (v1): each token is read as role admin (users "
            f"token-1, token-2, ...); to give tokens users and roles, add one with "
            f"`{fleetctl('serve', '--new-token', '--tokens', str(path), '--user', 'NAME', '--role', 'ROLE')}` "
            f"(the file is rewritten as v2, its tokens kept as token-N admin) or write it by hand "
            f"(first line {V2_HEADER!r}, then USER ROLE TOKEN a line)")


class Tokens:
    """Bearer tokens of named users with roles (:func:`parse_tokens`). The file must not be readable by group or
    others. A token presented is compared in constant time against every token."""

    def __init__(self, entries: Sequence[TokenEntry]) -> None:
        if not entries:
            raise TokenError("no API token: the tokens file holds none")
        short = [e for e in entries if len(e.token) < MIN_TOKEN_LENGTH]
        if short:
            raise TokenError(f"API tokens must be at least {MIN_TOKEN_LENGTH} characters ({len(short)} shorter)")
        self._entries = [(e.token.encode(), e.identity) for e in entries]

    @classmethod
    def of(cls, *pairs: tuple[str, Identity]) -> Tokens:
        """Tokens from (token, identity) pairs (tests, an app made in code)."""
        return cls([TokenEntry(who, token) for token, who in pairs])

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
        parsed = parse_tokens(text, path)
        if parsed.version == 1 and parsed.entries:
            log.warning("%s", upgrade_hint(path))
        return cls(parsed.entries)

    def identify(self, presented: str) -> Identity | None:
        """Whose token ``presented`` is, or None. Every token is compared: the time says nothing about which
        one matched."""
        given = presented.encode()
        found: Identity | None = None
        for token, who in self._entries:
            if hmac.compare_digest(token, given):
                found = who
        return found

    def check(self, presented: str) -> bool:
        return self.identify(presented) is not None

    def __repr__(self) -> str:  # never print a token
        return f"Tokens({len(self._entries)} tokens)"


class WatchedTokens(Tokens):
    """:class:`Tokens` of a file, read again when the file changes (its inode, size or mtime): a token removed from
    the file stops working at the next request, with no restart of ``fleetctl serve``. A changed file that cannot be
    used (unreadable, readable by others, a bad line, no token) fails closed: no token is accepted until it is
    fixed, and the reason is logged once."""

    def __init__(self, path: Path) -> None:
        """A bad file at start is a TokenError, as :meth:`Tokens.load` raises."""
        self._path = path
        self._lock = threading.Lock()
        # before the read: a change while it reads is read at the next request
        self._seen = self._signature()
        self._entries = Tokens.load(path)._entries
        self._broken = ""

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _refresh(self) -> None:
        sig = self._signature()
        with self._lock:
            if sig == self._seen:
                return
            self._seen = sig
            try:
                self._entries = Tokens.load(self._path)._entries
            except TokenError as exc:
                self._entries, why = [], str(exc)
                if why != self._broken:
                    log.error("API tokens file changed and cannot be used: %s; no token is accepted until it is "
                              "fixed", why)
                self._broken = why
                return
            if self._broken:
                log.warning("API tokens file %s is usable again (%d tokens)", self._path, len(self._entries))
            else:
                log.info("API tokens file %s read again (%d tokens)", self._path, len(self._entries))
            self._broken = ""

    def identify(self, presented: str) -> Identity | None:
        self._refresh()
        return super().identify(presented)


def new_token() -> str:
    return secrets.token_hex(24)


def add_token(path: Path, token: str, who: Identity) -> int:
    """Add ``token`` of ``who`` to the tokens file at ``path`` (created if absent; a v1 file rewritten as v2, its
    tokens kept as ``token-N admin``), which is left mode 0600 whatever it was; written to a temporary file and
    renamed (readers see the old file or the new one). The number of tokens it now holds."""
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise TokenError(f"API tokens are at least {MIN_TOKEN_LENGTH} characters, without spaces")
    check_user(who.user)
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        old = ""
    except OSError as exc:
        raise TokenError(f"{path}: cannot read the API tokens file: {exc.strerror or exc}") from None
    parsed = parse_tokens(old, path)
    if parsed.version == 2:
        text = old + ("" if old.endswith("\n") else "\n")
    else:
        # comments kept, each token given its v1 meaning in v2 words
        kept = {e.line: e for e in parsed.entries}
        text = V2_HEADER + "\n" + "".join(
            (line(kept[no].identity, kept[no].token) if no in kept else raw + "\n")
            for no, raw in enumerate(old.splitlines(), 1))
    text += line(who, token)
    # a duplicate, or the user with another role: refused before anything is written
    parse_tokens(text, path)
    try:
        write_atomic(path, text, mode=0o600)
    except OSError as exc:
        raise TokenError(f"{path}: cannot write the API tokens file: {exc.strerror or exc}") from None
    return len(parsed.entries) + 1


def line(who: Identity, token: str) -> str:
    """One line of a v2 tokens file."""
    return f"{who.user} {who.role.value} {token}\n"


__all__ = ["MIN_TOKEN_LENGTH", "V2_HEADER", "Identity", "Role", "TokenEntry", "TokenError", "Tokens", "TokensFile",
           "add_token", "check_user", "new_token", "parse_role", "parse_tokens"]
