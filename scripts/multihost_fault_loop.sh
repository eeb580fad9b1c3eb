#!/bin/bash
# The multi-host fault tests (kill -9 of process 0 or 1 mid-run then an exact resume of both, data parallel or with the
# 'context' axis across both processes; a SIGTERM of one; a process that cannot reach the workdir), N times each
# (default 20), outside the suite: a race would show as an occasional failure. PATTERN (pytest -k) picks some of them.
# Prints each test's count of passes out of N. Usage: scripts/multihost_fault_loop.sh [N] [PATTERN]
set -u
N=${1:-20}
PATTERN=${2:-}
PY=${PYTHON:-.venv/bin/python}
TESTS=(
  "tests/training/test_distributed.py::test_two_processes_match_one_survive_a_kill_9_of_process_1_and_resume_from_a_checkpoint_without_fingerprints"
  "tests/training/test_distributed.py::test_a_kill_9_of_process_0_the_coordinator_stops_process_1_and_both_resume_exactly"
  "tests/training/test_distributed.py::test_a_process_that_cannot_reach_the_workdir_stops_both_in_one_line_each"
  "tests/training/test_distributed.py::test_with_the_context_axis_across_both_processes_a_kill_9_of_either_stops_the_other_and_both_resume_exactly"
  "tests/training/test_distributed.py::test_with_the_context_axis_across_both_processes_a_sigterm_of_one_saves_and_stops_both_and_both_resume_exactly"
)
log=$(mktemp)
for i in $(seq "$N"); do
  JAX_PLATFORMS=cpu "$PY" -m pytest -q -rA -p no:cacheprovider -k "$PATTERN" "${TESTS[@]}" >>"$log" 2>&1
  echo "round $i of $N done"
done
for t in "${TESTS[@]}"; do
  name=${t##*::}
  for case in $(grep -o "^PASSED ${t//\//\\/}[^ ]*\|^FAILED ${t//\//\\/}[^ ]*" "$log" | awk '{print $2}' | sort -u); do
    echo "${case##*::}: $(grep -c "^PASSED ${case//[/\\[}\( \|$\)" "$log") passed of $N"
  done
done
echo "full output: $log"
