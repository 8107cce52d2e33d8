#!/usr/bin/env bash
# The powered Recall study (docs/results/control_recall.md, "The powered study"): every run still missing under
# experiments/results/control_recall/powered/runs/, seed by seed (slea, its retrieval-off evaluation and held-out
# trace, then grpo), each made with the package and script of the fixed checkout FIXED (a `git worktree` of the
# commit that fixed the design) and committed as soon as it finishes, so an interrupted study resumes here.
#   experiments/recall_powered.sh FIXED [WRAPPER ...]
# WRAPPER (optional) runs each step, e.g. a queue that keeps heavy jobs one at a time on a small machine.
set -euo pipefail
fixed=$(cd "$1" && pwd); shift
root=$(cd "$(dirname "$0")/.." && pwd)
results=$root/experiments/results/control_recall
py=${PYTHON:-$root/.venv/bin/python}
seeds=$("$py" -c "import json,sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['seeds'])))" \
  "$results/powered/power.json")
run() {  # run ARM SEED: train (slea: and evaluate with retrieval off, and trace), then commit the run folder
  local arm=$1 seed=$2 d=$results/powered/runs/$1-s$2
  if [ -f "$d/eval/summary.json" ] && { [ "$arm" != slea ] || [ -f "$d/trace/diagnosis.json" ]; }; then return; fi
  PYTHONPATH="$fixed/src" SLEA_CONTROL_RECALL_DIR="$results" "${wrap[@]}" "$py" "$fixed/experiments/control_recall.py" \
    run --arm "$arm" --seed "$seed" --study powered --set model.dtype=float32
  if [ "$arm" = slea ]; then
    PYTHONPATH="$fixed/src" SLEA_CONTROL_RECALL_DIR="$results" "${wrap[@]}" "$py" \
      "$fixed/experiments/control_recall.py" trace --seed "$seed" --study powered --set model.dtype=float32
  fi
  commit "$d" "Recall powered study: $arm seed $seed"
}
commit() {  # commit FOLDER MESSAGE: only that folder; a few tries, since other commits may hold the index lock
  local i
  for i in 1 2 3 4 5 6; do
    (cd "$root" && git add "$1" && git commit -q -m "$2" -- "$1") && return 0
    sleep 10
  done
  echo "recall_powered: could not commit $1" >&2
}
wrap=("$@")
for seed in $seeds; do
  run slea "$seed"
  run grpo "$seed"
done
