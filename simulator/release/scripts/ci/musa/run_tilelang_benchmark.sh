#!/usr/bin/env bash
# Benchmark the running server: MODEL_KEY=<key> scripts/ci/musa/run_tilelang_benchmark.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m m1000_sim.bench
