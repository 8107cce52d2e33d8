"""Where the default job's iterations spend their time, op by op and phase by phase: ``torch.profiler`` tables of
the three model phases of ``slea train configs/default.yaml`` as it really runs (the job's own prompts, rows and
micro-batches, the trie of shared prefixes), where bench/profile_step.py profiles fixed batches.

The job runs in this process (the CLI's ``train``) for ``--iterations`` iterations with the evaluation cut to one
sampled episode after training and no evaluation before (bench/cpu_iteration.py's overrides). Three functions are
wrapped, each call in its own profiler (they never nest):

- ``generation``: ``HFGenerator.generate``, every rollout turn's batch (and the one evaluation episode's turns);
- ``old_logprobs``: ``fill_old_and_reference``, the no-grad π_old forward before the first optimizer step;
- ``update``: ``accumulated_step``, one optimizer step: its micro-batches' forward and backward, clipping, AdamW.

Each op's self CPU time is summed over the calls and put in bench/profile_step.py's kinds. For generation it also
counts the prefill's token positions per call (:func:`prefill_positions`): the real prompt tokens of the distinct
prompts, what the engine computes over their trie of shared prefixes (slea/policy/prefix.py; padding included),
and what it computed before the trie (the common prefix once, then each distinct rest left-padded to the longest).
Beside the tables:
the phases' wall seconds from the profilers and the job's own time split (``metrics.jsonl``), so what the
profiled phases leave out (env steps, retrieval, prompt building, bookkeeping) is visible. Profiling adds a few
per cent of overhead per op: read the shares, not the seconds, against unprofiled runs.

    PYTHONPATH=src .venv/bin/python bench/profile_iteration.py [--iterations 2] [--out bench/results/profile_iteration]

writes ``BASE.json`` and ``BASE.md`` under ``--out``, BASE the frozen base's storage. ``--set KEY=VALUE`` adds
overrides (``--set model.name_or_path=tiny`` is a smoke run). Run it alone on the machine: it is a timing.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_iteration import overrides
from mfu import cpu_kind
from profile_step import KINDS, kind_of, phase_tables

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "results" / "profile_iteration"
PHASES = {"generation": ("slea.policy.generation.HFGenerator", "generate"),
          "old_logprobs": ("slea.trainer.update", "fill_old_and_reference"),
          "update": ("slea.trainer.update", "accumulated_step")}


class PhaseProfile:
    """Self CPU seconds per op, wall seconds and calls, summed over every profiled call of one phase."""

    def __init__(self) -> None:
        self.self_s: Counter[str] = Counter()
        self.op_calls: Counter[str] = Counter()
        self.wall_s = 0.0
        self.calls = 0

    def wrap(self, fn):
        from torch.profiler import ProfilerActivity, profile

        @functools.wraps(fn)
        def profiled(*args, **kwargs):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                self.wall_s += time.perf_counter() - t0
            self.calls += 1
            for e in prof.key_averages():
                self.self_s[e.key] += e.self_cpu_time_total / 1e6
                self.op_calls[e.key] += e.count
            return out
        return profiled

    def table(self) -> dict:
        ops = [{"op": op, "kind": kind_of(op), "self_s": s, "calls": self.op_calls[op]}
               for op, s in self.self_s.most_common() if s > 0]
        kinds: defaultdict[str, float] = defaultdict(float)
        for o in ops:
            kinds[o["kind"]] += o["self_s"]
        total = sum(kinds.values()) or 1.0
        return {"wall_s": self.wall_s, "calls": self.calls, "profiled_self_s": total,
                "kinds": {k: kinds[k] for k in KINDS}, "kind_share": {k: kinds[k] / total for k in KINDS},
                "ops": ops}


def prefill_positions(prompts: list[list[int]]) -> dict[str, int]:
    """Prefill token positions of one generation call over its distinct prompts: ``tokens`` (every distinct
    prompt's tokens), ``trie`` (padding included: each level of the trie as one left-padded batch, then the rows'
    own tokens) and ``common_prefix`` (the engine before the trie: the common prefix at batch 1, then the rests
    left-padded to the longest)."""
    from slea.policy.generation import shared_prefix
    from slea.policy.prefix import build_trie

    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    trie = build_trie(distinct)
    levels = [trie.level(d) for d in range(1, trie.depth + 1)]
    prefix = shared_prefix([list(p) for p in distinct])
    return {"calls": 1, "rows": len(prompts), "distinct": len(distinct), "tokens": sum(map(len, distinct)),
            "trie": sum(len(nodes) * max(len(trie.nodes[n].tokens) for n in nodes) for nodes in levels)
            + len(distinct) * max(len(p) - trie.own_start(r) for r, p in enumerate(distinct)),
            "common_prefix": prefix + len(distinct) * max(len(p) - prefix for p in distinct)}


def counted(fn, totals: Counter[str]):
    """``HFGenerator.generate`` adding each call's :func:`prefill_positions` to ``totals``."""
    @functools.wraps(fn)
    def generate(self, prompts, *args, **kwargs):
        totals.update(prefill_positions(prompts))
        return fn(self, prompts, *args, **kwargs)
    return generate


def patched(profiles: dict[str, PhaseProfile], prefill: Counter[str]) -> list:
    """The ``mock.patch`` objects that route each phase's function through its profiler."""
    import importlib

    patches = []
    for phase, (where, name) in PHASES.items():
        module_name, _, cls = where.rpartition(".") if where.endswith("HFGenerator") else (where, "", "")
        owner = getattr(importlib.import_module(module_name), cls) if cls else importlib.import_module(where)
        fn = getattr(owner, name)
        if phase == "generation":
            fn = counted(fn, prefill)
        patches.append(mock.patch.object(owner, name, profiles[phase].wrap(fn)))
    return patches


def markdown(res: dict, top: int) -> str:
    job = res["job_time_s"]
    lines = [f"# Profile of the default job's iterations ({res['iterations']} iterations)", "",
             (f"CPU: {res['cpu']}; {res['threads']} threads; torch {res['torch']}; model.base_dtype "
              f"{res['base_dtype']}; commit {res['commit']}; self CPU time summed over the iterations "
              "(bench/profile_iteration.py)."), "",
             "The job's own split (metrics.jsonl, summed over the iterations; it includes the profilers' own start and "
             "stop): " + ", ".join(
                 f"{k} {v:.1f} s" for k, v in job.items()), ""]
    pre = res["prefill_positions"]
    lines += [(f"Generation's prefill over {pre['calls']} calls ({pre['rows']} rows, {pre['distinct']} distinct "
              f"prompts of {pre['tokens']:,} tokens): {pre['trie']:,} token positions computed over the trie, "
              f"{pre['common_prefix']:,} with the common prefix alone."), ""]
    for phase, p in res["phases"].items():
        lines += phase_tables(f"{phase}: {p['wall_s']:.1f} s in {p['calls']} calls", p, top, digits=3)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    import subprocess

    import torch

    from slea.cli import app
    from slea.device import resolve_base_storage
    from slea.runs.folder import RunFolder

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more overrides")
    ap.add_argument("--top", type=int, default=25, help="ops per table in the markdown")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=False, capture_output=True,
                            text=True).stdout.strip()  # the code this process imports, taken before it runs
    profiles = {phase: PhaseProfile() for phase in PHASES}
    with tempfile.TemporaryDirectory(prefix="slea-profile-iter-") as tmp:
        run_dir = Path(tmp) / "run"
        sets = overrides(args.iterations, run_dir) + args.extra
        argv_train = ["train", str(ROOT / "configs/default.yaml"), *[a for o in sets for a in ("--set", o)]]
        prefill: Counter[str] = Counter()
        patches = patched(profiles, prefill)
        for p in patches:
            p.start()
        try:
            app(argv_train, standalone_mode=False)
        finally:
            for p in patches:
                p.stop()
        rows = [json.loads(line) for line in RunFolder(run_dir).metrics.read_text().splitlines() if line]
        summary = json.loads(RunFolder(run_dir).summary.read_text())
    keys = ("time/iteration_s", "time/generation_s", "time/env_s", "time/train_s", "update/old_logprobs_s")
    res = {"what": __doc__.split("\n")[0], "overrides": sets[:-1] + args.extra, "iterations": len(rows),
           "cpu": cpu_kind(), "threads": torch.get_num_threads(), "torch": torch.__version__,
           "base_dtype": resolve_base_storage("auto", device="cpu", lora=True,
                                              dtype=summary["precision"]["training"]),
           "commit": commit,
           "date": time.strftime("%Y-%m-%d"),
           "job_time_s": {k.split("/")[1]: sum(r.get(k, 0.0) for r in rows) for k in keys},
           "phases": {phase: p.table() for phase, p in profiles.items()}, "prefill_positions": dict(prefill)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{res['base_dtype']}.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / f"{res['base_dtype']}.md").write_text(markdown(res, args.top))
    for phase, p in res["phases"].items():
        print(f"{phase}: {p['wall_s']:.1f} s in {p['calls']} calls; " + ", ".join(
            f"{k} {p['kind_share'][k]:.0%}" for k in KINDS if p["kind_share"][k] >= 0.01))
    print(f"prefill positions: {prefill}")
    print(f"wrote {args.out}")
    return res


if __name__ == "__main__":
    main()
