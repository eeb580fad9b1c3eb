#!/usr/bin/env bash
# The CPU-scale reproduction behind docs/results.md: softmax, ssmax, lssa and lssar `tiny` models
# (trained at 64 tokens) for 2 seeds, 600 steps each, then the suite to 16x with LSSA+re-weighting.
# Rerunning resumes unfinished runs and skips finished ones. About an hour on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/repro}
OUT=${OUT:-reports/repro}
STEPS=${STEPS:-600}
workdirs=()
for seed in 0 1; do
  for variant in softmax ssmax lssa lssar; do
    dir="$RUNS/$variant-seed$seed"
    workdirs+=("--workdir=$dir")
    [ -e "$dir/finished" ] && continue
    "$PY" train.py --config="configs/$variant.py:tiny" --workdir="$dir" --config.train.seed="$seed" \
      --config.train.steps="$STEPS" --config.train.eval_every=100 --config.train.checkpoint_every=100
    touch "$dir/finished"
  done
done
"$PY" eval.py "${workdirs[@]}" --switch=p=15 --switch=p=3 --max_windows=16 --out="$OUT"
