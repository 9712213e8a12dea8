#!/usr/bin/env bash
# The comparison with ADVI and Pathfinder (docs/guide/which_method.md), from scratch:
# sets up .venv with the bench and vi extras, runs benchmarks/bench_vs_vi.py on the models
# of the guide's table, then prints the table and draws the figure from the results.
# About 60 minutes on 2 cores. Arguments are passed to every run (e.g. --draws 500).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup_env.sh" python3 .venv bench,vi
py="$root/.venv/bin/python"
out="$root/benchmarks/results"
export OPENBLAS_NUM_THREADS=1
cd "$root"
"$py" benchmarks/bench_vs_vi.py --models fertility_morekids_logistic,birthdays_state_poisson \
    --rows 10000,100000 --out "$out/vs_vi.json" "$@"
"$py" benchmarks/bench_vs_vi.py --models cdnow_bgnbd_clv,tv16_votetrump_state_bambi \
    --rows 10000,all --out "$out/vs_vi_clients.json" "$@"
"$py" benchmarks/bench_vs_vi.py --models military_officer_logistic \
    --rows 10000,100000 --per-row-reference-max 50000 --out "$out/vs_vi_military.json" "$@"
# At 10⁶ rows: nutpie on the posterior's sufficient statistics (the entry's reference);
# full-data ADVI, which reads every row at each of its iterations, is not run.
"$py" benchmarks/bench_vs_vi.py --models military_officer_logistic --rows 1000000 \
    --methods step,advi-mb,pathfinder --out "$out/vs_vi_military_1e6.json" "$@"
# Minibatch ADVI with 100-row batches on the same configurations (each run samples its
# nutpie reference again; the report keeps the first file's).
mb100=(--methods advi-mb --batch-sizes 100)
"$py" benchmarks/bench_vs_vi.py --models fertility_morekids_logistic,birthdays_state_poisson \
    --rows 10000,100000 "${mb100[@]}" --out "$out/vs_vi_mb100.json" "$@"
"$py" benchmarks/bench_vs_vi.py --models cdnow_bgnbd_clv --rows 10000,all "${mb100[@]}" \
    --out "$out/vs_vi_clients_mb100.json" "$@"
"$py" benchmarks/bench_vs_vi.py --models military_officer_logistic --rows 10000,100000 \
    --per-row-reference-max 50000 "${mb100[@]}" --out "$out/vs_vi_military_mb100.json" "$@"
"$py" benchmarks/bench_vs_vi.py --models military_officer_logistic --rows 1000000 \
    "${mb100[@]}" --out "$out/vs_vi_military_1e6_mb100.json" "$@"
"$py" benchmarks/bench_vs_vi.py --report "$out/vs_vi.json" "$out/vs_vi_clients.json" \
    "$out/vs_vi_military.json" "$out/vs_vi_military_1e6.json" "$out/vs_vi_mb100.json" \
    "$out/vs_vi_clients_mb100.json" "$out/vs_vi_military_mb100.json" \
    "$out/vs_vi_military_1e6_mb100.json" --plot docs/_static/vs_vi_error_seconds.png
