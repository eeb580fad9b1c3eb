#!/usr/bin/env bash
# MQAR extrapolation on 2 CPU cores (docs/results.md "Retrieval: MQAR"): softmax, ssmax, lssa, lssar and the
# softmax_logn control, 3 seeds each, `--config=mqar:variant=V` (fused form: 2-layer tiny model, trained at 32 tokens
# on 4 pairs, 2,000 steps), then per-query accuracy at 1x-16x on INSTANCES instances (x 4 queries) per length, the
# same pairs at every length, with paired differences against softmax. Rerunning resumes unfinished runs and skips
# finished ones; the evaluation is redone at the end. Measured: 55 min 12 s on 2 CPU cores shared with
# scripts/reproduce_cpu.sh (1,000 steps, then resumed to 2,000: docs/results.md). STEPS, SEEDS, FORM and INSTANCES may be overridden.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
FORM=${FORM:-fused}
RUNS=${RUNS:-runs/mqar-$FORM}
OUT=${OUT:-reports/mqar-$FORM}
STEPS=${STEPS:-2000}
SEEDS=${SEEDS:-"0 1 2"}
INSTANCES=${INSTANCES:-256}
workdirs=()
for seed in $SEEDS; do
  for variant in softmax ssmax lssa lssar softmax_logn; do
    dir="$RUNS/$variant-seed$seed"
    workdirs+=("--workdir=$dir")
    [ -e "$dir/finished" ] && continue
    "$PY" train.py --config="mqar:variant=$variant,form=$FORM" --workdir="$dir" --config.train.seed="$seed" \
      --config.train.steps="$STEPS"
    touch "$dir/finished"
  done
done
"$PY" eval.py "${workdirs[@]}" --mqar_instances="$INSTANCES" --out="$OUT"
