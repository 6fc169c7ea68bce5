#!/usr/bin/env bash
# Create .venv (Python 3.10+) and install the toolchain with its test extras; builds the C simulator.
#
# Skips what is already done: the package is installed in editable mode, so Python edits need no
# reinstall; it is reinstalled only when what the install depends on changed (pyproject.toml,
# setup.py, this script, the list of packages under python/), and the simulator is rebuilt only
# when sim/ changed (or ACCELSIM_WERROR=1 asks for a -Werror build the last one was not).
# The hashes of the sources last installed are kept in .venv/.tvm-accel-*.sha256. pip's output
# goes to .venv/pip-install.log, shown only when it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WERROR=${ACCELSIM_WERROR:-0}

# hash of the named files and of every file under the named directories (names and contents)
tree_hash() {
    find "$@" -type f ! -name '*.so' ! -name '*.pyc' ! -path '*.egg-info*' -print0 \
        | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}
packages=$(find python -maxdepth 2 -name __init__.py | LC_ALL=C sort)
install_hash=$( { tree_hash pyproject.toml setup.py scripts/setup.sh; echo "$packages"; } | sha256sum | cut -d' ' -f1)
sim_hash="$(tree_hash sim) werror=$WERROR"
install_stamp=.venv/.tvm-accel-install.sha256
sim_stamp=.venv/.tvm-accel-sim.sha256
log=.venv/pip-install.log

quiet() {  # run "$@" with its output in $log; on failure show the log and stop
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "setup: failed: $* (output above, also in $log)" >&2
        exit 1
    fi
}

sim_built() {  # the stamp matches and the library loads with the ABI the package expects
    local have
    have=$(cat "$sim_stamp" 2>/dev/null || true)
    { [ "$have" = "$sim_hash" ] || { [ "$WERROR" != 1 ] && [ "${have% *}" = "${sim_hash% *}" ]; }; } &&
        .venv/bin/python -c "import tvm_accel.simlib as s; s.get_lib()" >/dev/null 2>&1
}

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if [ "$(cat "$install_stamp" 2>/dev/null || true)" != "$install_hash" ] ||
        ! .venv/bin/python -c "import tvm_accel" >/dev/null 2>&1; then
    echo "setup: installing tvm-accel and its dependencies into .venv (pip log: $log)"
    rm -f "$install_stamp" "$sim_stamp"
    quiet .venv/bin/python -m pip install --upgrade pip
    quiet .venv/bin/python -m pip install -e ".[test]"
    echo "$install_hash" >"$install_stamp"
    echo "$sim_hash" >"$sim_stamp"
elif ! sim_built; then
    echo "setup: rebuilding the simulator library (sim/ changed, or -Werror asked for)"
    quiet .venv/bin/python setup.py -q build_sim
    echo "$sim_hash" >"$sim_stamp"
else
    echo "setup: .venv is up to date with the sources (install skipped)"
fi
.venv/bin/python -c "import tvm_accel.simlib as s; s.get_lib()"
