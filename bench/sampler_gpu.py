"""What the agent's telemetry costs on an NVIDIA GPU, and whether it slows a fast server (issue 45, item 4).

1. One ``nvidia-smi`` query as the agent asks it (its 17 fields, CSV): wall and CPU a call (20 calls).
2. NVML's energy counter: which binding loads (``nvidia-ml-py``, else the driver's library through ctypes, as
   ``agent/telemetry/nvml.py``), the cost of a read, and its resolution against time.
3. A fast, launch-bound decode stand-in (a CUDA loop of 120 small matrix-vector products per step, one sync
   per step: about llama.cpp's ~1 ms a token on an H100) timed per step, 4 s per setting, rounds interleaved,
   beside: nothing; ``nvidia-smi`` every 0.11 s and every 0.04 s (another process, as the agent is); NVML's
   counter read every 0.04 s (another process); and the loop writing 5 trace-level log lines a step (as
   llama-server at ``-lv 4``) to /dev/null, against the same lines through a pipe read by a reader that does
   what the agent's output pump does (``agent/executor.py``: 64 KiB reads, a timestamp a line, a log file,
   a flush per read). Ratios against "nothing" of the same round.

Self-contained (python3 with torch on the GPU machine; no project import but ``bench/record.py``):
    python3 bench/sampler_gpu.py [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import resource
import statistics as st
import subprocess as sp
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import record  # bench/record.py, this script's folder

QUERY = ("--query-gpu=index,name,uuid,temperature.gpu,temperature.memory,power.draw,power.limit,clocks.sm,clocks.mem,"
         "clocks.gr,clocks.max.sm,utilization.gpu,utilization.memory,memory.used,memory.total,"
         "clocks_event_reasons.active,ecc.errors.uncorrected.volatile.total")
SMI = (f"import subprocess,time\nwhile 1:\n subprocess.run(['nvidia-smi','{QUERY}','--format=csv,noheader,nounits'],"
       "capture_output=True)\n time.sleep(%s)")
NVML = ("import ctypes,time\nL=ctypes.CDLL('libnvidia-ml.so.1');L.nvmlInit_v2();h=ctypes.c_void_p()\n"
        "L.nvmlDeviceGetHandleByIndex_v2(0,ctypes.byref(h));e=ctypes.c_ulonglong()\n"
        "while 1:\n L.nvmlDeviceGetTotalEnergyConsumption(h,ctypes.byref(e));time.sleep(0.04)")
PUMP = ("import os,sys,time\nf=open('/tmp/pump.log','w')\nwhile 1:\n b=os.read(0,65536)\n if not b: break\n"
        " for l in b.split(b'\\n'): f.write(time.strftime('%H:%M:%S')+' [err] '+l.decode('utf-8','replace')+'\\n')\n"
        " f.flush()")
LINE = (b"slot update_slots: id  0 | task 12 | n_past = 4242, n_tokens = 1, memory_seq_rm [4242, end) "
        b"srv  update_slots: decoded 1 token\n")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def nvml() -> tuple[str, Callable[[], int]]:
    if importlib.util.find_spec("pynvml") is not None:
        binding = "nvidia-ml-py importable"
    else:
        binding = "nvidia-ml-py NOT importable (the agent falls back to ctypes)"
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    assert lib.nvmlInit_v2() == 0
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
    e = ctypes.c_ulonglong()

    def read() -> int:
        assert lib.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(e)) == 0
        return int(e.value)

    return binding, read


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import torch

    print(f"== {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {os.cpu_count()} CPUs")
    argv = ["nvidia-smi", QUERY, "--format=csv,noheader,nounits"]
    sp.run(argv, capture_output=True, check=True)
    walls = []
    c0 = children_cpu()
    for _ in range(20):
        t = time.perf_counter()
        sp.run(argv, capture_output=True, check=True)
        walls.append(time.perf_counter() - t)
    cpu = (children_cpu() - c0) / 20
    print(f"1. nvidia-smi query (17 fields): wall median {st.median(walls) * 1e3:.1f} ms (min {min(walls) * 1e3:.1f}, "
          f"max {max(walls) * 1e3:.1f}), CPU {cpu * 1e3:.1f} ms a call")
    binding, read = nvml()
    t = time.perf_counter()
    vals = [read() for _ in range(2000)]
    per = (time.perf_counter() - t) / 2000
    changes, t0, last = 0, time.perf_counter(), read()
    while time.perf_counter() - t0 < 1.0:
        v = read()
        changes += v != last
        last = v
    print(f"2. NVML counter: {binding}; ctypes read {per * 1e6:.1f} us; value {vals[-1]} mJ; "
          f"{changes} changes in 1 s of reads (its update rate)")

    dev = torch.device("cuda")
    ws = [torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16) for _ in range(120)]
    x = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
    null = os.open(os.devnull, os.O_WRONLY)

    def loop(seconds: float, log_fd: int | None) -> list[float]:
        out = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            y = x
            for w in ws:
                y = torch.tanh(y @ w)
            torch.cuda.synchronize()
            if log_fd is not None:
                os.write(log_fd, LINE * 5)
            out.append(time.perf_counter() - t)
        return out

    loop(2.0, None)  # warm-up
    settings = ["nothing", "smi 0.11 s", "smi 0.04 s", "nvml 0.04 s", "log to /dev/null", "log through a pump"]
    got: dict[str, list[float]] = {s: [] for s in settings}
    ratio: dict[str, list[float]] = {s: [] for s in settings}
    side_cpu: dict[str, list[float]] = {s: [] for s in settings}
    for r in range(a.rounds):
        base = None
        for s in settings if r % 2 == 0 else [settings[0], *reversed(settings[1:])]:
            helper = None
            fd = None
            if s.startswith("smi"):
                helper = sp.Popen([sys.executable, "-c", SMI % s.split()[1]])
            elif s.startswith("nvml"):
                helper = sp.Popen([sys.executable, "-c", NVML])
            elif s == "log to /dev/null":
                fd = null
            elif s == "log through a pump":
                rfd, fd = os.pipe()
                helper = sp.Popen([sys.executable, "-c", PUMP], stdin=rfd)
                os.close(rfd)
            time.sleep(0.5)
            c0 = children_cpu()
            steps = loop(a.seconds, fd)
            if helper is not None:
                if s == "log through a pump":
                    assert fd is not None
                    os.close(fd)
                    helper.wait(10)
                else:
                    helper.kill()
                    helper.wait()
            side_cpu[s].append((children_cpu() - c0) / a.seconds)
            med = st.median(steps)
            got[s].append(med)
            if s == "nothing":
                base = med
            assert base is not None
            ratio[s].append(med / base)
    print(f"3. a launch-bound decode stand-in (120 kernels a step), median step per {a.seconds:g} s, {a.rounds} rounds "
          "interleaved; ratio to 'nothing' of the same round; the side process's CPU (share of one core, incl. the "
          "tools it ran)")
    print("| beside the loop | step ms (each round) | ratio (each round) | side CPU |")
    print("| --- | --- | --- | --- |")
    for s in settings:
        print(f"| {s} | {', '.join(f'{v * 1e3:.3f}' for v in got[s])} | {', '.join(f'{v:.3f}' for v in ratio[s])} | "
              f"{st.median(side_cpu[s]) * 100:.1f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
