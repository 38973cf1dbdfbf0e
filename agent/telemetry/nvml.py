"""NVML's cumulative energy counter, read through ``nvidia-ml-py`` where it is installed (the one NVML seam).

``nvidia-smi`` cannot print the counter (``--query-gpu=total_energy_consumption`` is "not a valid field
to query"), so the sampler reads it beside the tool's answer: ``nvmlDeviceGetTotalEnergyConsumption``,
millijoules since the driver was loaded, per device index (the same order as ``nvidia-smi``'s). Where
``nvidia-ml-py`` is missing, NVML cannot start, or a device has no counter, there is no reader and the
energy comes from the power samples (:mod:`agent.telemetry.energy`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def nvml_counter() -> Callable[[], dict[int, float]] | None:
    """A reader of every device's energy counter (mJ per device index), or None when NVML offers none."""
    try:
        nv: Any = importlib.import_module("pynvml")  # nvidia-ml-py: optional, not in the agent's lock
        nv.nvmlInit()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        for h in handles:  # a device without the counter (before Volta) raises NVMLError_NotSupported here
            nv.nvmlDeviceGetTotalEnergyConsumption(h)
    except Exception:  # ImportError, NVMLError_*: no counter to read
        return None

    def read() -> dict[int, float]:
        return {i: float(nv.nvmlDeviceGetTotalEnergyConsumption(h)) for i, h in enumerate(handles)}

    return read
