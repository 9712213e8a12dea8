#!/usr/bin/env bash
# Set everything up on a fresh machine and run the main demonstration: the Gaussian
# mixture of Seita et al. (2017, section 6.1) with MinibatchBarker at the paper's size.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup_env.sh python3 .venv examples
.venv/bin/python examples/gaussian_mixture.py "$@"
