#!/usr/bin/env bash
# Start the SGLang-MUSA server for Qwen3-30B-A3B-GPTQ-Int4 in the foreground on $SERVER_HOST:$SERVER_PORT.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
MODEL="Qwen3-30B-A3B-GPTQ-Int4"
EXTRA=()
exec "$PY" -S -m m1000_sim.server --workflow-model "$MODEL" --host "${SERVER_HOST:-127.0.0.1}" \
    --port "${SERVER_PORT:-30000}" --max-total-tokens 16384 --tp-size 1 --trust-remote-code \
    ${EXTRA[@]+"${EXTRA[@]}"}
