"""URLs fit for a log line or an error message: credentials, query and fragment taken out."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """``url`` without what may carry a secret: the userinfo becomes ``***`` (``:***`` when it held only a
    password, so a broker URL still reads as one with a password), the query and the fragment (tokens)
    are dropped; scheme, host, port and path stay as written. A URL with none of these comes back as it
    was; one that does not parse comes back as ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at and not parts.query and not parts.fragment and "?" not in url and "#" not in url:
        return url
    netloc = ((":***" if userinfo.startswith(":") else "***") + "@" + hostport) if at else hostport
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
