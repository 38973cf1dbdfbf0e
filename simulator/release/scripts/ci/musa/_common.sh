# Shared prologue of the release's scripts, sourced by them (not run on its own) after they set $here to their
# folder: $HERE (that folder, absolute), $PY, PYTHONPATH, and run_program.
# An absolute path (how the scripts are run) is taken as it is: a subshell and a dirname are a fork and an exec of
# every script on every module.
case $here in
  /*) HERE=$here ;;
  *) HERE="$(cd "$here" && pwd)" ;;
esac
PY="${PYTHON:-python3}"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"

# run_program MODULE ARG...: the release's program m1000_sim.MODULE in place of this shell. ``python3 -S -c``
# calling its main, not ``python3 -m`` (runpy and importlib.util: ~3 ms of CPU more per start).
run_program() {
  local module=$1
  shift
  exec "$PY" -S -c "import sys; from m1000_sim.$module import main; sys.exit(main())" "$@"
}
