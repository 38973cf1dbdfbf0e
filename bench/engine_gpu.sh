#!/usr/bin/env bash
# The real-engine validation on the lent GPU machine (run from a folder holding repo/ and whl/):
#   bash repo/bench/engine_gpu.sh            (writes its report to $OUT/engine_gpu.txt when OUT is set)
# whl/ holds the wheels the machine lacks (transformers 5.24 and its serving stack, the agent's
# dependencies) for its python3 (3.12), which already has torch with CUDA.
set -euo pipefail
here="$(pwd)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$here"/whl/*.whl
export PYTHONPATH="/tmp/site:$here/repo" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0), "transformers", transformers.__version__)'
report="${OUT:-/tmp}/engine_gpu.txt"
python3 "$here/repo/bench/engine_run.py" --device cuda:0 --big 0.5b --profiles "128,1000;2000@250" \
    --output-len 100 --out /tmp/engine-run 2>&1 | grep -v -e "Writing model shards" -e "Loading weights" | tee "$report"
cp /tmp/engine-run/work/runs/engine-bench/logs/*server-qwen35.log "${OUT:-/tmp}/" 2>/dev/null || true
