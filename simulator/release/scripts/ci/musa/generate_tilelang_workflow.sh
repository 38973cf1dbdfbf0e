#!/usr/bin/env bash
# Generate the TileLang workflow (tilelang_workflow.json) from tilelang_workflow_config.json.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m m1000_sim.workflow generate --config "$HERE/tilelang_workflow_config.json" \
    --out "$HERE/tilelang_workflow.json"
