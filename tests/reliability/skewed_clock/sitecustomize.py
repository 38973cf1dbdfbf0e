"""Test-only: a Python process started with this folder on ``PYTHONPATH`` has its wall clock off by
``M1000_TEST_CLOCK_OFFSET`` seconds (an edge module without NTP). ``time.time``/``time.time_ns`` are
shifted, the monotonic clock and the kernel's (file times, the broker's clock) are not.

libfaketime would shift the C library's clocks instead, but Debian's 0.9.10 breaks CPython's sleeps and
timed waits (``clock_nanosleep`` fails with EINVAL when the monotonic clock is left alone, and
``sem_clockwait`` waits for ever when it is shifted too).
"""

import os
import time

_OFFSET = float(os.environ.get("M1000_TEST_CLOCK_OFFSET", "0") or 0)
if _OFFSET:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _OFFSET
    time.time_ns = lambda: _time_ns() + int(_OFFSET * 1e9)
