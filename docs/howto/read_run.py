"""Read a run folder without slea's report: the held-out evaluation before and after, and the learning curve.

    python docs/howto/read_run.py runs/howto-env

Every file it reads is plain JSON (eval/summary.json) or JSON lines (metrics.jsonl, one line per iteration).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

run = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/howto-env")
summary = json.loads((run / "eval" / "summary.json").read_text())
for when in ("before", "after"):
    if summary.get(when):
        s = summary[when]["sampled"]
        print(f"held-out {when:6}: success {s['success']:.3f}  invalid {s['invalid_rate']:.3f}  "
              f"({s['episodes']:.0f} sampled episodes)")

rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
print(f"{'iter':>4} {'success':>8} {'return':>8} {'invalid':>8} {'loss':>8} {'grad':>8} {'iter s':>7}")
for m in rows:
    print(f"{m['iteration']:>4} {m['train/success']:>8.3f} {m['train/return']:>8.3f} {m['train/invalid_rate']:>8.3f} "
          f"{m.get('update/loss', float('nan')):>8.4f} {m.get('update/grad_norm', float('nan')):>8.3f} "
          f"{m['time/iteration_s']:>7.1f}")
