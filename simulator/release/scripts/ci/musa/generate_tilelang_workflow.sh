#!/usr/bin/env bash
# Generate the TileLang workflow (tilelang_workflow.json) from tilelang_workflow_config.json.
set -euo pipefail
here=${BASH_SOURCE[0]%/*}; [[ $here != "${BASH_SOURCE[0]}" ]] || here=.
source "$here/_common.sh"
run_program workflow generate --config "$HERE/tilelang_workflow_config.json" \
    --out "$HERE/tilelang_workflow.json"
