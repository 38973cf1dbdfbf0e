"""A release path as a person typed it: ``~user`` of an unknown user is bad input (one line, HTTP 400),
not an internal error (found by schemathesis: ``"~0"`` answered 500)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.errors import exit_code_of, http_status_of
from controller.service import BadRequest, release_request


def test_unknown_users_home_is_bad_input() -> None:
    with pytest.raises(BadRequest, match="~no-such-user-0") as e:
        release_request("~no-such-user-0/r.tar.gz")
    assert http_status_of(e.value) == 400 and exit_code_of(e.value) == 2


def test_a_plain_path_and_a_url_still_pass() -> None:
    assert release_request("dist/r.tar.gz").release == Path("dist/r.tar.gz")
    req = release_request("https://example.org/r.tar.gz")
    assert req.release is None and req.url == "https://example.org/r.tar.gz"
