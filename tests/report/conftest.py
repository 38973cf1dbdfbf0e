"""Fixtures of the report tests: the seed's rows and its reference frame (tests/support/frames.py)."""

from tests.support.frames import reference, seed_rows  # noqa: F401 - fixtures, registered by name
