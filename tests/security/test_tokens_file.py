"""The API's tokens file (issue 32, item 3): v2 lines of named users with roles, the old flat file read as admin
with a warning, and every bad line refused in one line naming the file and the line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from controller.serve.tokens import V2_HEADER, Identity, Role, TokenError, Tokens, parse_tokens

A, B, C = "a" * 24, "b" * 24, "c" * 24


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_v2_lines_are_users_with_roles(tmp_path, caplog):
    p = write(tmp_path / "tokens", f"\n{V2_HEADER}\n# CI\nci trigger {A}\n  rita   read {B}  \n\nada admin {C}\n"
                                   f"ci trigger {'d' * 24}\n")
    with caplog.at_level(logging.WARNING):
        t = Tokens.load(p)
    assert caplog.records == []  # v2: nothing to warn about
    assert [t.identify(x) for x in (A, B, C, "d" * 24, A[:-1], "")] == [
        Identity("ci", Role.trigger), Identity("rita", Role.read), Identity("ada", Role.admin),
        Identity("ci", Role.trigger), None, None]
    assert t.check(A) and not t.check(A + "x")
    assert A not in repr(t) and repr(t) == "Tokens(4 tokens)"
    assert [(e.identity.user, e.line) for e in parse_tokens(p.read_text(), p).entries] == [
        ("ci", 4), ("rita", 5), ("ada", 7), ("ci", 8)]


def test_roles_are_ordered():
    assert [(have.value, need.value) for have in Role for need in Role if have.allows(need)] == [
        ("read", "read"), ("trigger", "read"), ("trigger", "trigger"),
        ("admin", "read"), ("admin", "trigger"), ("admin", "admin")]


def test_a_flat_file_is_read_as_admin_tokens_with_a_warning(tmp_path, caplog, monkeypatch):
    import os
    import sys

    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]))  # `fleetctl`
    p = write(tmp_path / "tokens", f"# the CI's\n{A}\n\n{B}\n")
    with caplog.at_level(logging.WARNING, logger="fleet.api"):
        t = Tokens.load(p)
    assert [t.identify(A), t.identify(B)] == [Identity("token-1", Role.admin), Identity("token-2", Role.admin)]
    assert [r.getMessage() for r in caplog.records] == [
        f"{p}: API tokens file of the old flat format (v1): each token is read as role admin (users token-1, "
        f"token-2, ...); to give tokens users and roles, add one with "
        f"`fleetctl serve --new-token --tokens {p} --user NAME --role ROLE` "
        f"(the file is rewritten as v2, its tokens kept as token-N admin) or write it by hand (first line "
        f"'# m1000-fleet tokens v2', then USER ROLE TOKEN a line)"]


@pytest.mark.parametrize(("text", "says"), [
    (f"{V2_HEADER}\nci trigger\n", "2: 2 fields; a line is USER ROLE TOKEN"),
    (f"{V2_HEADER}\nci trigger {A} extra\n", "2: 4 fields; a line is USER ROLE TOKEN"),
    (f"{V2_HEADER}\n# ok\nci root {A}\n", "3: role 'root': one of read, trigger, admin"),
    (f"{V2_HEADER}\n-ci read {A}\n", "2: user name '-ci': 1-64 letters, digits or ._@- (starting with a letter or "
                                     "digit)"),
    (f"{V2_HEADER}\nci read short\n", "2: API tokens must be at least 16 characters"),
    (f"{V2_HEADER}\nci read {A}\nada admin {A}\n", "3: the same token as line 2 (each token once)"),
    (f"{V2_HEADER}\nci read {A}\nci admin {B}\n",
     "3: user ci has role read on line 2 and admin here (one role a user)"),
    (f"{A}\n{B}\n{A}\n", "3: the same token as line 1 (each token once)"),
    (f"{A}\nshort\n", "2: API tokens must be at least 16 characters"),
    # a v2 file that lost its first line: its lines would be admin tokens "ci read aaaa..."
    (f"ci read {A}\n", "1: a token with a space in a file without the first line '# m1000-fleet tokens v2' (a v2 "
                       "file's lines are USER ROLE TOKEN; a v1 file's one token each)"),
])
def test_a_bad_line_is_one_line_naming_file_and_line(tmp_path, text, says):
    p = write(tmp_path / "tokens", text)
    with pytest.raises(TokenError) as exc:
        Tokens.load(p)
    assert str(exc.value) == f"{p}:{says}"


def test_the_old_checks_stay(tmp_path):
    with pytest.raises(TokenError, match="holds none"):
        Tokens.load(write(tmp_path / "empty", f"{V2_HEADER}\n# nobody yet\n"))
    p = write(tmp_path / "open", f"{V2_HEADER}\nci read {A}\n")
    p.chmod(0o640)
    with pytest.raises(TokenError, match="readable by others"):
        Tokens.load(p)


def test_a_token_removed_from_the_file_stops_working_without_a_restart(tmp_path, caplog):
    """Issue 48: fleetctl serve read the file once; a removed token kept working until serve restarted. The file
    is read again when it changes; a changed file that cannot be used fails closed, said once, until fixed."""
    import os

    from controller.serve.tokens import WatchedTokens

    p = write(tmp_path / "tokens", f"{V2_HEADER}\nci trigger {A}\nrita read {B}\n")
    t = WatchedTokens(p)
    assert t.identify(A) == Identity("ci", Role.trigger) and t.check(B)
    write(p, f"{V2_HEADER}\nrita read {B}\nada admin {C}\n")  # ci's token revoked, ada's added
    assert t.identify(A) is None and t.identify(C) == Identity("ada", Role.admin) and t.check(B)
    with caplog.at_level(logging.ERROR):
        p.chmod(0o644)  # readable by others: refused, and nothing is accepted meanwhile
        os.utime(p, ns=(0, 1))  # a change the next request notices (the mode alone leaves size and mtime)
        assert not t.check(B) and not t.check(C)
    (said,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]  # once, though asked twice
    assert said.startswith(f"API tokens file changed and cannot be used: {p}: the API tokens file is readable by "
                           f"others (chmod 600 {p}; ") and said.endswith("no token is accepted until it is fixed")
    write(p, f"{V2_HEADER}\nrita read {B}\n")
    assert t.check(B) and not t.check(C)
    p.unlink()  # gone: fails closed too
    assert not t.check(B)
