#!/usr/bin/env bash
# The state-key gate's runs (docs/results/state_key.md): every run still missing under
# experiments/results/evidence/gate_{default,hard}/, in order (slea_key's runs, then slea's; per job, per seed), each made
# with the package and script of the fixed checkout FIXED (a `git worktree` of the commit that fixed the gate) and
# committed as soon as it finishes, so an interrupted gate resumes here.
#   experiments/state_key_gate.sh FIXED [WRAPPER ...]
# WRAPPER (optional) runs each step, e.g. a queue that keeps heavy jobs one at a time on a small machine.
set -euo pipefail
fixed=$(cd "$1" && pwd); shift
root=$(cd "$(dirname "$0")/.." && pwd)
results=$root/experiments/results/evidence
py=${PYTHON:-$root/.venv/bin/python}
wrap=("$@")
commit() {  # commit FOLDER MESSAGE: only that folder; a few tries, since other commits may hold the index lock
  local i
  for i in 1 2 3 4 5 6; do
    (cd "$root" && git add "$1" && git commit -q -m "$2" -- "$1") && return 0
    sleep 10
  done
  echo "state_key_gate: could not commit $1" >&2
}
for variant in slea_key slea; do  # the key's runs first: the gate's criteria are theirs, the raw runs stand beside
  for job in gate_default gate_hard; do
    for seed in 0 1 2; do
      d=$results/$job/$variant/runs/slea-s$seed
      [ -f "$d/eval/summary.json" ] && continue
      SLEA_EVIDENCE_DIR="$results" PYTHONPATH="$fixed/src" "${wrap[@]}" "$py" "$fixed/experiments/slea_evidence.py" \
        run --job "$job" --variant "$variant" --seed "$seed"
      commit "$d" "State-key gate: $job $variant seed $seed"
    done
  done
done
