#!/usr/bin/env bash
# Build the documentation site on a fresh machine: set up .venv-docs (the package with its
# `docs` extra), run the docstring examples as doctests, then build the HTML with Sphinx,
# warnings treated as errors, into docs/_build/html.
#
#   bash scripts/docs.sh                         # full build: the gallery runs the examples
#                                                # at their own (paper) sizes
#   DOCS_GALLERY=reduced bash scripts/docs.sh    # quick build: the gallery at small sizes (CI)
#   DOCS_GALLERY=off bash scripts/docs.sh        # the gallery is not executed
#
# Other variables: DOCS_NB_EXECUTION=force|cache|off (the executed pages, default force),
# DOCS_DOCTEST=0 to skip the doctests. Extra arguments go to sphinx-build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

export DOCS_GALLERY=${DOCS_GALLERY:-full}
case $DOCS_GALLERY in
    full | reduced | off) ;;
    *) echo "DOCS_GALLERY must be full, reduced or off (got '$DOCS_GALLERY')" >&2; exit 2 ;;
esac
# Two shared cores: one BLAS thread per process (multi-threaded BLAS on tiny vectors only
# slows the samplers down when the machine is busy).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}

bash scripts/setup_env.sh python3 .venv-docs docs
py="$root/.venv-docs/bin/python"
start=$(date +%s)

if [[ ${DOCS_DOCTEST:-1} != 0 ]]; then
    echo "==> doctests of the package's docstrings"
    "$py" -m pytest --doctest-modules pymc_minibatch_mh -p no:cacheprovider -q
fi

echo "==> sphinx-build (gallery: $DOCS_GALLERY) into docs/_build/html"
# A fresh build every time (-E, and no stale generated pages), so that the pages reflect
# the current package and DOCS_GALLERY.
rm -rf docs/api/generated docs/auto_examples
"$py" -m sphinx -E -W --keep-going -b html -d docs/_build/doctrees docs docs/_build/html "$@"
echo "==> docs built in $(( $(date +%s) - start )) s: open docs/_build/html/index.html"
