"""A series of simulated nightly releases with a regression planted at one of them (``fleetctl bisect``'s test
bed): ``python -m simulator build-series OUT --count 16 --regress-at 9 --regress qwen3:decode_tps:0.08``.

Release ``i`` is ``<base>.dev<date + i days>`` (``1.5.0.dev20261101``, ``1.5.0.dev20261102``, ...: in release
order by version and by date); from ``regress_at`` on every release carries the regression; ``broken`` ones fail
to start their servers (a candidate a bisection must skip). Each release has its own seed (``seed + i``)."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable

from simulator.build import BuildError, BuiltRelease, build_release
from simulator.specs import regress_spec

MAX_SERIES = 256


def build_series(out_dir: str | os.PathLike[str], *, count: int = 16, regress_at: int, regress: str,
                 base: str = "1.5.0", start: str = "20261101", noise: float | str = 0.0,
                 time_scale: float | str = 50.0, seed: int = 0, broken: Iterable[int] = ()) -> list[BuiltRelease]:
    """Write ``count`` release tarballs into ``out_dir``, oldest first (see the module's docstring)."""
    if not 2 <= count <= MAX_SERIES:
        raise BuildError(f"--count {count}: give 2 to {MAX_SERIES}")
    if not 0 < regress_at < count:
        raise BuildError(f"--regress-at {regress_at}: give 1 to {count - 1} (release 0 is the good one)")
    broken = sorted(set(broken))
    if any(not 0 < b < count - 1 for b in broken):
        raise BuildError(f"--broken {','.join(map(str, broken))}: give indices 1 to {count - 2} (not the ends)")
    try:
        day0 = dt.datetime.strptime(start, "%Y%m%d").date()
    except ValueError:
        raise BuildError(f"--start {start!r}: expected YYYYMMDD") from None
    speed = regress_spec(regress)
    out = []
    for i in range(count):
        date = (day0 + dt.timedelta(days=i)).strftime("%Y%m%d")
        out.append(build_release(out_dir, version=f"{base}.dev{date}", date=date, noise=noise,
                                 speed=speed if i >= regress_at else "1.0", time_scale=time_scale, seed=seed + i,
                                 faults="start-fail" if i in broken else ""))
    return out
