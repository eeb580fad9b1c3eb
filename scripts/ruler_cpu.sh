#!/usr/bin/env bash
# The RULER-style suite at CPU scale (docs/results.md "RULER-style long-context suite"): the `tiny` softmax, ssmax, lssa
# and lssar runs of scripts/reproduce_cpu.sh (trained by it, TRAIN_ONLY=1: 600 steps at 64 tokens, a quarter passkey
# windows, seeds 0 1 2; finished runs are skipped, so runs/repro is shared with it), then freeatten-eval's RULER tasks
# at 1x-16x, EXAMPLES examples per task and length, scored by string match and by likelihood rank (the loss, passkey
# and attention cells the suite always measures are cut to their minimum: one 16x window, one key at depth 0.5),
# then the lm-eval adapter (freeatten-harness) on the local YAML tasks in tests/harness_tasks at 1x.
# Rerunning resumes: training from the last checkpoint, the evaluation from its last saved cell (OUT/cells); the
# harness is redone. STEPS, SEEDS, EXAMPLES and JOBS may be overridden.
set -euo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-.venv/bin/python} RUNS=${RUNS:-runs/repro}
OUT=${OUT:-reports/ruler}
SEEDS=${SEEDS:-"0 1 2"}
VARIANTS="softmax ssmax lssa lssar"
EXAMPLES=${EXAMPLES:-4}
TASKS=niah_single,niah_multikey,niah_multivalue,niah_multiquery,vt,cwe,fwe

start=$(date +%s)
TRAIN_ONLY=1 SEEDS="$SEEDS" VARIANTS="$VARIANTS" JOBS=${JOBS:-1} scripts/reproduce_cpu.sh
echo "training: $(($(date +%s) - start)) s"
workdirs=()
for seed in $SEEDS; do
  for variant in $VARIANTS; do workdirs+=("--workdir=$RUNS/$variant-seed$seed"); done
done
step=$(date +%s)
"$PY" eval.py "${workdirs[@]}" --ruler="$TASKS" --ruler_examples="$EXAMPLES" --span_windows=1 --passkey_keys=1 \
  --passkey_depths=0.5 --out="$OUT"
echo "RULER-style suite: $(($(date +%s) - step)) s"
step=$(date +%s)
"$PY" -c 'from freeatten_jax.cli import scripts; scripts.harness()' "${workdirs[@]}" --default_tasks=false \
  --include_path=tests/harness_tasks --tasks=tiny_word,tiny_choice,tiny_answer,tiny_text --out="$OUT/harness"
echo "harness: $(($(date +%s) - step)) s"
echo "total: $(($(date +%s) - start)) s"
