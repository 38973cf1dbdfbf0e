"""NVML's cumulative energy counter (the one NVML seam): ``nvidia-ml-py`` where installed, else the driver's
``libnvidia-ml.so.1`` through ``ctypes``.

``nvidia-smi`` cannot print the counter (``--query-gpu=total_energy_consumption`` is "not a valid field
to query"), so the sampler reads it beside the tool: ``nvmlDeviceGetTotalEnergyConsumption``, millijoules
since the driver was loaded (an unsigned 64-bit count), per device index (the same order as
``nvidia-smi``'s), at each edge of a benchmark window (:meth:`agent.telemetry.sampler.Sampler.edge`) and
with every sample. ``nvidia-ml-py`` is not in the agent's lock (an M1000 module has no NVML); the library
itself comes with every NVIDIA driver, so the ``ctypes`` path reads the counter wherever ``nvidia-smi``
runs. Where neither loads, NVML cannot start, or a device has no counter (before Volta), there is no reader
and the energy comes from the power samples (:mod:`agent.telemetry.energy`).
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable
from typing import Any

Reader = Callable[[], dict[int, float]]
LIBRARY = "libnvidia-ml.so.1"


def _pynvml() -> Reader:
    nv: Any = importlib.import_module("pynvml")  # nvidia-ml-py
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    # a device without the counter raises NVMLError_NotSupported here
    for h in handles:
        nv.nvmlDeviceGetTotalEnergyConsumption(h)

    def read() -> dict[int, float]:
        return {i: float(nv.nvmlDeviceGetTotalEnergyConsumption(h)) for i, h in enumerate(handles)}

    return read


def _ctypes(library: str = LIBRARY) -> Reader:
    lib = ctypes.CDLL(library)

    def check(rc: int, what: str) -> None:
        if rc != 0:  # NVML_SUCCESS
            raise OSError(f"{what}: NVML error {rc}")

    check(lib.nvmlInit_v2(), "nvmlInit_v2")
    count = ctypes.c_uint(0)
    check(lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
    handles = []
    for i in range(count.value):
        h = ctypes.c_void_p()
        check(lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(h)), "nvmlDeviceGetHandleByIndex_v2")
        handles.append(h)
    energy = lib.nvmlDeviceGetTotalEnergyConsumption
    energy.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong)]

    def read() -> dict[int, float]:
        out: dict[int, float] = {}
        for i, h in enumerate(handles):
            mj = ctypes.c_ulonglong(0)
            check(energy(h, ctypes.byref(mj)), f"nvmlDeviceGetTotalEnergyConsumption of device {i}")
            out[i] = float(mj.value)
        return out

    # a device without the counter fails here (NVML_ERROR_NOT_SUPPORTED)
    read()
    return read


def nvml_counter() -> Reader | None:
    """A reader of every device's energy counter (mJ per device index), or None when NVML offers none."""
    for make in (_pynvml, _ctypes):
        try:
            reader = make()
        except Exception:
            # ImportError, OSError (no library, NVML error), NVMLError_*: try the next, else none
            continue
        if reader():  # no device: no counter
            return reader
    return None


def counter_source() -> str:
    """Which NVML binding :func:`nvml_counter` would use ("nvidia-ml-py", "ctypes" or "none"), for a bench's log."""
    for name, make in (("nvidia-ml-py", _pynvml), ("ctypes", _ctypes)):
        try:
            make()
        except Exception:  # same as nvml_counter
            continue
        return name
    return "none"
