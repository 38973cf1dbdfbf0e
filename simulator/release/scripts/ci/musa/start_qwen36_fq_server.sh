#!/usr/bin/env bash
# Start the SGLang-MUSA server for Qwen3.6_FQ-35B-A3B in the foreground on $SERVER_HOST:$SERVER_PORT.
set -euo pipefail
here=${BASH_SOURCE[0]%/*}; [[ $here != "${BASH_SOURCE[0]}" ]] || here=.
source "$here/_common.sh"
MODEL="Qwen3.6_FQ-35B-A3B"
EXTRA=()
run_program server --workflow-model "$MODEL" --host "${SERVER_HOST:-127.0.0.1}" \
    --port "${SERVER_PORT:-30000}" --max-total-tokens 16384 --tp-size 1 --trust-remote-code \
    ${EXTRA[@]+"${EXTRA[@]}"}
