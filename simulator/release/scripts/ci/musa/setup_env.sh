# Environment of SGLang-MUSA @VERSION@ on M1000: source it (source scripts/ci/musa/setup_env.sh).
# this folder and the release's top folder: from an absolute path as they are (no subshell, no dirname)
_m1000_here=${BASH_SOURCE[0]%/*}
case ${BASH_SOURCE[0]} in
  /*/scripts/ci/musa/*) ;;
  */*) _m1000_here="$(cd "$_m1000_here" && pwd)" ;;
  *) _m1000_here="$PWD" ;;
esac
case $_m1000_here in
  /*/scripts/ci/musa) _m1000_root=${_m1000_here%/scripts/ci/musa} ;;
  *) _m1000_root="$(cd "$_m1000_here/../../.." && pwd)" ;;
esac
if [ ! -f "$_m1000_here/tilelang_workflow.json" ]; then
    echo "setup_env.sh: error: $_m1000_here/tilelang_workflow.json not found: run scripts/ci/musa/generate_tilelang_workflow.sh first" >&2
    unset _m1000_here _m1000_root
    return 1 2>/dev/null || exit 1
fi
export SGLANG_MUSA_RELEASE_DIR="$_m1000_root"
export SGLANG_MUSA_VERSION="@VERSION@"
export TILELANG_WORKFLOW_FILE="$_m1000_here/tilelang_workflow.json"
export TILELANG_CACHE_DIR="${TILELANG_CACHE_DIR:-$_m1000_root/.tilelang_cache}"
export MUSA_VISIBLE_DEVICES="${MUSA_VISIBLE_DEVICES:-0}"
export SGLANG_TL_ENABLE=1
# the versions of the stack a real release runs on (its Python has no such packages: the agent's environment
# fingerprint reads these instead)
export MUSA_VERSION="4.0.0-sim" TORCH_MUSA_VERSION="2.1.0-sim" TRITON_VERSION="3.1.0-sim" TILELANG_VERSION="0.1.6-sim"
unset _m1000_here _m1000_root
