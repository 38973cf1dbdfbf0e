"""The module's own figures for the exporter: load, memory, disk of the work folder, GPU from sysfs.

Read per scrape from ``/proc`` (``os.getloadavg``, psutil) and the sysfs files found once at start;
a figure that cannot be read stays None and its series absent.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from agent.metrics.catalog import label_value


@dataclass(frozen=True)
class SystemSample:
    load: tuple[float, float, float] | None = None
    mem_total: int | None = None
    mem_available: int | None = None
    disk_free: int | None = None
    disk_total: int | None = None
    # gpu -> 0..1, and gpu -> degrees Celsius
    gpu_util: dict[str, float] = field(default_factory=dict)
    gpu_temp: dict[str, float] = field(default_factory=dict)


def _read_number(path: Path) -> float | None:
    try:
        return float(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class GpuFiles:
    """sysfs files that give GPU figures without root, found once at start."""

    # percent files, millidegree files
    util: tuple[tuple[str, Path], ...] = ()
    temp: tuple[tuple[str, Path], ...] = ()

    @classmethod
    def discover(cls, sys_root: Path = Path("/sys")) -> GpuFiles:
        util: list[tuple[str, Path]] = []
        temp: list[tuple[str, Path]] = []
        for card in sorted((sys_root / "class" / "drm").glob("card[0-9]*")):
            if "-" in card.name:  # connectors (card0-HDMI-A-1)
                continue
            dev = card / "device"
            busy = dev / "gpu_busy_percent"
            if _read_number(busy) is not None:
                util.append((card.name, busy))
            for t in sorted(dev.glob("hwmon/hwmon*/temp1_input")):
                if _read_number(t) is not None:
                    temp.append((card.name, t))
                    break
        for zone in sorted((sys_root / "class" / "thermal").glob("thermal_zone*")):
            try:
                kind = (zone / "type").read_text(encoding="ascii").strip()
            except OSError:
                continue
            if "gpu" in kind.lower() and _read_number(zone / "temp") is not None:
                temp.append((label_value(kind, zone.name), zone / "temp"))
        return cls(tuple(util), tuple(temp))


class SystemProbe:
    """Load, memory, disk of the work folder, GPU where readable. Absent figures stay None."""

    def __init__(self, workdir: Path, sys_root: Path = Path("/sys")) -> None:
        self.workdir = workdir
        self.gpus = GpuFiles.discover(sys_root)

    def __call__(self) -> SystemSample:
        import psutil

        try:
            load: tuple[float, float, float] | None = os.getloadavg()
        except OSError:
            load = None
        vm = psutil.virtual_memory()
        try:
            du = shutil.disk_usage(self.workdir)
            free, total = int(du.free), int(du.total)
        except OSError:
            free = total = None  # type: ignore[assignment]
        util = {g: v / 100.0 for g, p in self.gpus.util if (v := _read_number(p)) is not None}
        temp = {g: v / 1000.0 for g, p in self.gpus.temp if (v := _read_number(p)) is not None}
        return SystemSample(load, int(vm.total), int(vm.available), free, total, util, temp)
