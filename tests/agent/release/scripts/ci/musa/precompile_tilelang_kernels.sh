#!/usr/bin/env bash
set -euo pipefail
[ "${FAKE_SETUP:-}" = "1" ] || { echo "setup_env.sh not sourced" >&2; exit 3; }
mkdir -p "$TILELANG_CACHE_DIR"
echo "run" >> "$TILELANG_CACHE_DIR/precompile.count"
echo "precompiling kernels into $TILELANG_CACHE_DIR"
sleep "${FAKE_PRECOMPILE_SLEEP:-0}"
# FAKE_PRECOMPILE_OUT: a folder the kernels (4 MiB) are written to (a test's small tmpfs fills for real)
[ -z "${FAKE_PRECOMPILE_OUT:-}" ] || head -c 4194304 /dev/zero > "$FAKE_PRECOMPILE_OUT/kernels.bin"
if [ "${FAKE_FAIL_PRECOMPILE:-0}" = "1" ]; then echo "precompile: kernel error" >&2; exit 9; fi
echo "precompile done"
