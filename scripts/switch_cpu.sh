#!/usr/bin/env bash
# The SSMax paper's switch at CPU scale (docs/results.md "Switching attention"): `tiny` models trained as in
# scripts/reproduce_cpu.sh (600 steps at 64 tokens, a quarter passkey windows), softmax, ssmax, lssa and lssar from
# scratch, then warm starts (config.init.path) that switch attention:
#   (e)  softmax@600 -> ssmax: evaluated as switched (step 0, no training) and after CONTINUE more steps;
#   (f)  softmax@450 -> ssmax at 75% of training, trained CONTINUE steps to the end;
#   LSSA -> LSSAR: lssa@600 -> lssar, as switched (step 0: the LSSA paper's re-weighting at inference) and trained on;
#   the control softmax@600 -> softmax, trained CONTINUE more steps (what CONTINUE more steps change with no switch).
# Every continuation replays the tail of the source's schedule (the lr of step 450, 7.7e-4, cosine down to the
# source's floor 3e-4 over CONTINUE steps, after a 10-step warm-up of the fresh optimizer state). Seed k of every run
# shares its data order. Then the suite on the same held-out span at 1x-16x, as trained and with the SSMax paper's
# protocol (RoPE base x50 on the softmax-family models), paired against softmax by seed and window.
# STEPS, CONTINUE, SEEDS, JOBS, EVAL_TOKENS and EVAL_FLAGS (more eval.py flags) may be overridden.
# Runs JOBS at a time; rerunning resumes unfinished runs and skips finished ones; the evaluation is redone at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-.venv/bin/python} STEPS=${STEPS:-600} CONTINUE=${CONTINUE:-150}
export RUNS=${RUNS:-runs/switch}
export COMMON="--config.data.retrieval_fraction=0.25 --config.train.eval_every=150 --config.train.eval_windows=252"
OUT=${OUT:-reports/switch}
SEEDS=${SEEDS:-"0 1 2"}
JOBS=${JOBS:-2}
SWITCH_AT=$((STEPS * 3 / 4))

train_one() {  # name config seed [flags...]: one run, marked finished when done
  local dir="$RUNS/$1-seed$3" config=$2 seed=$3
  shift 3
  [ -e "$dir/finished" ] && return 0
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  "$PY" train.py --config="$config" --workdir="$dir" --config.train.seed="$seed" $COMMON "$@" > "$dir/train.log" 2>&1 \
    || { tail -n 5 "$dir/train.log"; return 1; }
  touch "$dir/finished"
  echo "trained $dir"
}
export -f train_one

scratch() {
  for seed in $SEEDS; do
    for variant in softmax ssmax lssa lssar; do
      echo "$variant $variant:tiny $seed --config.train.steps=$STEPS --config.train.checkpoint_every=$((STEPS / 4))"
    done
  done
}

continued() {  # warm starts from the scratch runs: name, new variant, source checkpoint
  local tail="--config.train.steps=$CONTINUE --config.train.checkpoint_every=$CONTINUE --config.optim.lr=7.7e-4"
  tail+=" --config.optim.warmup_steps=10 --config.optim.min_lr_ratio=0.39"
  for seed in $SEEDS; do
    echo "e_softmax-ssmax ssmax:tiny $seed --config.init.path=$RUNS/softmax-seed$seed@$STEPS $tail"
    echo "f_softmax-ssmax ssmax:tiny $seed --config.init.path=$RUNS/softmax-seed$seed@$SWITCH_AT $tail"
    echo "lssa-lssar lssar:tiny $seed --config.init.path=$RUNS/lssa-seed$seed@$STEPS $tail"
    echo "c_softmax-softmax softmax:tiny $seed --config.init.path=$RUNS/softmax-seed$seed@$STEPS $tail"
  done
}

start=$(date +%s)
scratch | xargs -P "$JOBS" -L 1 bash -c 'train_one "$@"' _
continued | xargs -P "$JOBS" -L 1 bash -c 'train_one "$@"' _
echo "training: $(( $(date +%s) - start )) s"
checkpoints=()
for seed in $SEEDS; do
  for run in softmax ssmax lssa lssar e_softmax-ssmax f_softmax-ssmax lssa-lssar c_softmax-softmax; do
    checkpoints+=("--workdir=$RUNS/$run-seed$seed")
  done
  checkpoints+=("--workdir=$RUNS/e_softmax-ssmax-seed$seed@0" "--workdir=$RUNS/lssa-lssar-seed$seed@0")
done
"$PY" eval.py "${checkpoints[@]}" --switch=rope_theta=50x@softmax+ssmax --eval_tokens="${EVAL_TOKENS:-32800}" \
  --passkey_keys=1 --passkey_depths=0.5 --out="$OUT" ${EVAL_FLAGS:-}
echo "total: $(( $(date +%s) - start )) s"
