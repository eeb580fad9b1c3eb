#!/usr/bin/env bash
# MQAR extrapolation on 2 CPU cores (docs/results.md "Retrieval: MQAR"): softmax, ssmax, lssa, lssar and the
# softmax_logn control, 10 seeds each, `--config=mqar:variant=V` (fused form: 2-layer tiny model, trained at 32 tokens
# on 4 pairs, queries drawn with replacement, 2,000 steps), JOBS runs at a time, then per-query accuracy at 1x-16x on
# INSTANCES instances (x 4 queries) per length, the same pairs at every length, placed at the start (as in training),
# at the end and at the end with competing pairs of unqueried keys before them (dilute; docs/method.md §7), as trained
# and with RoPE's base x50 (the SSMax paper's protocol: does distance cost less with slower-turning positions?), every
# query's hit saved, with paired differences against softmax (bootstrap and over seeds). Rerunning resumes unfinished
# runs and skips finished ones; the evaluation is redone at the end. Wall time: docs/results.md. STEPS, SEEDS, FORM,
# JOBS and INSTANCES may be overridden.
set -euo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-.venv/bin/python} FORM=${FORM:-fused} STEPS=${STEPS:-2000}
export RUNS=${RUNS:-runs/mqar-$FORM}
OUT=${OUT:-reports/mqar-$FORM}
SEEDS=${SEEDS:-"0 1 2 3 4 5 6 7 8 9"}
JOBS=${JOBS:-2}
INSTANCES=${INSTANCES:-256}

train_one() {  # variant seed: one run, marked finished when done
  local dir="$RUNS/$1-seed$2"
  [ -e "$dir/finished" ] && return 0
  mkdir -p "$dir"
  "$PY" train.py --config="mqar:variant=$1,form=$FORM" --workdir="$dir" --config.train.seed="$2" \
    --config.train.steps="$STEPS" > "$dir/train.log" 2>&1 || { tail -n 5 "$dir/train.log"; return 1; }
  touch "$dir/finished"
  echo "trained $dir"
}
export -f train_one

runs() {  # "variant seed", one line a run
  for seed in $SEEDS; do
    for variant in softmax ssmax lssa lssar softmax_logn; do echo "$variant $seed"; done
  done
}
runs | xargs -P "$JOBS" -L 1 bash -c 'train_one "$@"' _
workdirs=()
while read -r variant seed; do workdirs+=("--workdir=$RUNS/$variant-seed$seed"); done < <(runs)
"$PY" eval.py "${workdirs[@]}" --mqar_instances="$INSTANCES" --mqar_placements=start,end,dilute --switch=rope_theta=50x \
  --out="$OUT"
