"""What more than one test module uses: launchers, waits, labs, fixtures. Tests and conftests import
shared code from here only, never from another test module or conftest (tests/unit/test_test_imports.py)."""
