#!/usr/bin/env bash
# Set everything up on a fresh machine and run the test suite, under Python 3.11 with
# PyMC 5.x and, when pyenv's Python >= 3.12 is present, under it with PyMC 6.x.
# Extra arguments are passed to pytest (default: the fast suite, -m "not slow"). The tests
# run in parallel on every core (pytest-xdist; PYTEST_WORKERS=1 runs them in one process).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pytest_args=("$@")
[[ ${#pytest_args[@]} -eq 0 ]] && pytest_args=(-m "not slow")

# One BLAS thread per test process: the workers already use every core.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
status=0
run_suite() {
    local spec=$1 venv=$2
    bash scripts/setup_env.sh "$spec" "$venv" test
    echo "==> pytest in $venv ${pytest_args[*]}"
    "$venv/bin/python" -m pytest -n "${PYTEST_WORKERS:-auto}" "${pytest_args[@]}" || status=1
}

run_suite python3 .venv

py312=${PYMC6_PYTHON_VERSION:-3.12.1}
if command -v pyenv >/dev/null 2>&1 && PYENV_VERSION=$py312 python -c \
    'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; then
    run_suite "pyenv:$py312" .venv312
else
    echo "==> SKIPPED the PyMC 6.x suite: no Python >= 3.12 found through pyenv (PYENV_VERSION=$py312)."
fi
exit $status
