#!/usr/bin/env bash
# Precompile the TileLang kernels of the workflow's models into $TILELANG_CACHE_DIR.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m m1000_sim.workflow precompile
