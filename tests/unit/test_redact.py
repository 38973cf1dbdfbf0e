"""``contract.redact.redact_url``: the one rule for URLs in logs and error messages hides at least what each
of the three it replaced hid (the agent's Pushgateway URL, the broker URL, the webhook URL)."""

from __future__ import annotations

import pytest

from contract.redact import redact_url


@pytest.mark.parametrize("url, shown", [
    ("http://a:b@h:1/p", "http://***@h:1/p"),  # the Pushgateway rule: user and password
    ("sentinel://:s3cr%2Ft@127.0.0.1:26379/0", "sentinel://:***@127.0.0.1:26379/0"),  # a password-only broker URL
    ("rediss://fleet:pw@redis.lab:6380/1", "rediss://***@redis.lab:6380/1"),  # the broker rule kept the user
    ("rediss://fleet@redis.lab:6380/1", "rediss://***@redis.lab:6380/1"),
    ("https://hooks.example/x/y?token=abc#frag", "https://hooks.example/x/y"),  # the webhook rule: no query
    ("https://u:p@[::1]:8443/hook?t=1", "https://***@[::1]:8443/hook"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),  # nothing to hide: as it was
    ("filesystem://", "filesystem://"),
    ("http://[::1", "***"),  # does not parse: nothing of it shown
])
def test_credentials_query_and_fragment_are_hidden(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    for secret in ("s3cr", "pw", "token", "abc", "frag", ":p@", "a:b"):
        if secret in url:
            assert secret not in redact_url(url)
