#!/usr/bin/env bash
# Hand-made stand-in: checks the config was rewritten, fails on request.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
echo "generating workflow from $here/tilelang_workflow_config.json"
if [ "${FAKE_FAIL_GENERATE:-0}" = "1" ]; then echo "generate: boom" >&2; exit 7; fi
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("model_paths:", len(d["model_paths"]))' \
  "$here/tilelang_workflow_config.json"
touch "$here/workflow.generated"
