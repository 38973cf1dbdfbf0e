#!/usr/bin/env bash
# Precompile the TileLang kernels of the workflow's models into $TILELANG_CACHE_DIR.
set -euo pipefail
here=${BASH_SOURCE[0]%/*}; [[ $here != "${BASH_SOURCE[0]}" ]] || here=.
source "$here/_common.sh"
run_program workflow precompile
