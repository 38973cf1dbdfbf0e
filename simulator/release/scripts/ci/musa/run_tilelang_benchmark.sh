#!/usr/bin/env bash
# Benchmark the running server: MODEL_KEY=<key> scripts/ci/musa/run_tilelang_benchmark.sh
set -euo pipefail
here=${BASH_SOURCE[0]%/*}; [[ $here != "${BASH_SOURCE[0]}" ]] || here=.
source "$here/_common.sh"
run_program bench
