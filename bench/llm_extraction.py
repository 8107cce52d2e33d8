"""The ``llm`` experience extractor against the ``rule`` one, on the same real trajectories of the embedded model.

Rolls out ``--batches`` batches of a config (default configs/slea.yaml: 3 x 8 TextWorld episodes a batch) with its
untrained policy (``Trainer.collect`` on iterations 0, 1, ...; no update in between), keeps the clean episodes as
``Trainer.iteration`` does, and hands every batch to one fresh :class:`ExperienceManager` per extractor, whose
``evolve`` selects T+/T− (``extraction.select``), extracts, and admits the candidates into its own in-memory library
(novelty, K_strat/K_warn caps, capacities) exactly as in training. The ``llm`` extractor's prompts are answered by
the trainer's own ``generate_text`` (``slea.trainer.rl.experience_manager``: base weights with LoRA off, chat template,
multi-line, ``experience.extract_max_new_tokens``, greedy). Per extractor: prompts sent, raw answer lines, parsed
lessons, rule fallbacks, candidates, admissions (for ``llm``: how many were written by the model), library size,
seconds per selected trajectory (and as ratios: ``llm`` over ``rule``, extraction over the batch's rollout), and
up to ``--examples`` lessons with the raw model output they came from. Writes ``bench/results/llm_extraction.json``
and ``bench/results/llm_extraction.md``.

    .venv/bin/python bench/llm_extraction.py [--config configs/slea.yaml] [--batches 3] [--set KEY=VALUE ...]
    .venv/bin/python bench/llm_extraction.py --smoke     # the tiny model, 1 small batch: checks the wiring
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from slea.atomic import atomic_write_text
from slea.config import load_config
from slea.experience.extraction import select
from slea.experience.llm_extractor import LLMExtractor
from slea.experience.manager import ExperienceManager
from slea.experience.rule_extractor import RuleExtractor
from slea.rollout.sampling import iteration_seeds
from slea.trainer.guards import faulted
from slea.trainer.rl import Trainer
from slea.types import Trajectory

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "results"
EXTRACTORS = ("rule", "llm")
ADMITTED = ("added", "replaced")


class _MarkedRules(RuleExtractor):
    """The LLM extractor's rule fallback, remembering which candidates it made (they are not the model's)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: set[int] = set()

    def strategies(self, t):
        out = super().strategies(t)
        self.made.update(map(id, out))
        return out

    def warnings(self, t):
        out = super().warnings(t)
        self.made.update(map(id, out))
        return out


class Probe:
    """Wraps one manager's extractor, generator and library: timings, raw answers, candidates, admissions."""

    def __init__(self, manager: ExperienceManager) -> None:
        self.manager = manager
        ex = manager.extractor
        self.fallback = _MarkedRules() if isinstance(ex, LLMExtractor) else None
        if self.fallback is not None:
            ex.fallback = self.fallback
            gen = ex.generate_text
            ex.generate_text = lambda prompts: self._generate(gen, prompts)
        extract, add = ex.extract, manager.library.add
        ex.extract = lambda pos, neg: self._extract(extract, pos, neg)
        manager.library.add = lambda text, zone, *a, **kw: self._add(add, text, zone, *a, **kw)
        self.prompts = 0
        self.generate_s = 0.0
        self.answers: list[str] = []  # this batch's raw answers, in the order of the extractor's jobs
        self.extract_s = 0.0
        self.candidates: list = []  # this batch's candidates, as the extractor returned them
        self.model_texts: set[str] = set()  # texts the model wrote (every batch)
        self.admissions: list[tuple[str, str, str]] = []  # (text, task type, status) in the order evolve tried them

    def _generate(self, gen, prompts):
        t0 = time.perf_counter()
        out = gen(prompts)
        self.generate_s += time.perf_counter() - t0
        self.prompts += len(prompts)
        self.answers = [a if isinstance(a, str) else repr(a) for a in out]
        return out

    def _extract(self, extract, pos, neg):
        t0 = time.perf_counter()
        out = list(extract(pos, neg))
        self.extract_s += time.perf_counter() - t0
        self.candidates = out
        if self.fallback is not None:
            self.model_texts.update(c.text for c in out if id(c) not in self.fallback.made)
        return out

    def _add(self, add, text, zone, *a, **kw):
        r = add(text, zone, *a, **kw)
        self.admissions.append((text, kw.get("task_type", ""), r.status))
        return r


def collect(trainer: Trainer, batches: int) -> tuple[list[list[Trajectory]], list[dict[str, Any]]]:
    """``batches`` rollouts of the untrained policy; the clean episodes of each, as the trainer evolves on them."""
    out, info = [], []
    for it in range(batches):
        t0 = time.perf_counter()
        seeds = iteration_seeds(trainer.cfg.run.seed, it, trainer.cfg.rollout.groups)
        batch = next(trainer.rollouts.rounds(it, seeds))
        clean = [t for t in batch.collected if not faulted(t)]
        sec = time.perf_counter() - t0
        out.append(clean)
        info.append({"iteration": it, "episodes": len(batch.collected), "clean": len(clean), "rollout_s": sec,
                     "won": sum(bool(t.won) for t in clean),
                     "returns": sorted(round(t.episode_return, 3) for t in clean)})
        print(f"batch {it}: {len(clean)} episodes in {sec:.1f}s, returns {info[-1]['returns']}", flush=True)
    return out, info


def run_extractor(name: str, cfg, generate_text, batches: list[list[Trajectory]], n_examples: int
                  ) -> dict[str, Any]:
    """One fresh manager (in-memory library) evolving on every batch with extractor ``name``."""
    x = cfg.experience.model_copy(update={"extractor": name})
    probe = Probe(ExperienceManager(x, None, generate_text=generate_text))
    per_batch, examples, silent = [], [], []
    for it, trajs in enumerate(batches):
        extract_s, n_adm = probe.extract_s, len(probe.admissions)
        m = probe.manager.evolve(trajs, it)
        status: dict[tuple[str, str], str] = {}  # this batch's admissions: a text tried twice counts as admitted
        for text, tt, s in probe.admissions[n_adm:]:
            status[(text, tt)] = s if status.get((text, tt)) not in ADMITTED else status[(text, tt)]
        _, pos, neg = select(trajs, x.eta, x.k_traj, x.eta_tie)
        with_lesson = len({(c.sources[0], c.zone) for c in probe.candidates
                           if c.sources and (name != "llm" or c.text in probe.model_texts)})
        per_batch.append({"iteration": it, "selected": len(pos) + len(neg), "with_lesson": with_lesson,
                          "extract_s": probe.extract_s - extract_s,
                          **{k: v for k, v in m.items() if not k.startswith("size_") and k != "clusters"}})
        if name == "llm":
            _llm_examples(probe, pos, neg, status, examples, silent, n_examples)
        else:
            examples += [{"zone": c.zone, "level": c.level, "text": c.text, "task_type": c.task_type,
                          "status": status.get((c.text, c.task_type), "rate_limited")} for c in probe.candidates]
    return summarize(name, probe, per_batch, examples, silent, n_examples)


def _llm_examples(probe: Probe, pos, neg, status, examples, silent, n_examples) -> None:
    """Each lesson the model wrote in this batch, next to its raw answer; answers that gave none (fallbacks)."""
    jobs = [(t, "pos") for t in pos] + [(t, "neg") for t in neg]
    if len(probe.answers) != len(jobs):
        return
    raw = {(t.traj_id, z): (t, a) for (t, z), a in zip(jobs, probe.answers)}
    prefill = probe.manager.extractor.prefill
    used = set()
    for c in probe.candidates:
        if c.text not in probe.model_texts or not c.sources:
            continue
        key = (c.sources[0], c.zone)
        used.add(key)
        t, answer = raw.get(key, (None, ""))
        examples.append({"zone": c.zone, "level": c.level, "text": c.text, "task_type": c.task_type,
                         "status": status.get((c.text, c.task_type), "rate_limited"), "won": bool(t and t.won),
                         "raw": prefill + answer})
    seen = {e["raw"] for e in silent}
    for (tid, z), (t, a) in raw.items():
        if (tid, z) not in used and prefill + a not in seen and len(silent) < n_examples:
            seen.add(prefill + a)
            silent.append({"zone": z, "task_type": t.task_type, "won": bool(t.won), "raw": prefill + a})


def summarize(name: str, probe: Probe, per_batch: list[dict], examples: list[dict], silent: list[dict],
              n_examples: int) -> dict[str, Any]:
    tot = Counter()
    for b in per_batch:
        tot.update({k: v for k, v in b.items() if isinstance(v, float | int)})
    selected = int(tot["selected"])
    admitted = [text for text, _, s in probe.admissions if s in ADMITTED]
    lib = probe.manager.library
    out = {
        "extractor": name, "selected_trajectories": selected,
        "prompts": probe.prompts if name == "llm" else 0,
        "raw_lines": int(tot["extract_lines"]) if name == "llm" else None,
        "parsed_lessons": int(tot["extract_llm_items"]) if name == "llm" else int(tot["candidates"]),
        "fallbacks": int(tot["extract_fallback"]) if name == "llm" else None,
        "trajectories_with_lesson": int(tot["with_lesson"]),  # for llm: a lesson the model wrote
        "candidates": int(tot["candidates"]),
        "admitted": len(admitted),
        "admitted_model_written": sum(t in probe.model_texts for t in admitted) if name == "llm" else None,
        "statuses": dict(Counter(s for _, _, s in probe.admissions)) | {"rate_limited": int(tot["rate_limited"])},
        "library_size": len(lib),
        "library_model_written": sum(e.text in probe.model_texts for e in lib) if name == "llm" else None,
        "library_by_task_type": dict(Counter(e.task_type for e in lib)),
        "extract_s": probe.extract_s, "generate_s": probe.generate_s,
        "s_per_trajectory": probe.extract_s / max(1, selected),
        "drops": {k.removeprefix("extract_drop_"): int(v) for k, v in tot.items() if k.startswith("extract_drop_")},
        "per_batch": per_batch,
        "library": [{"zone": e.zone, "level": e.level, "task_type": e.task_type, "text": e.text} for e in lib],
    }
    rank = {"added": 0, "replaced": 0, "duplicate": 1, "rate_limited": 2, "rejected": 3}
    best = {}
    for e in sorted(examples, key=lambda e: rank.get(e["status"], 4)):  # each lesson once per task type
        best.setdefault((e["text"], e.get("task_type", "")), e)
    out["examples"] = list(best.values())[:n_examples]
    if name == "llm":
        out["answers_without_lesson"] = silent[:n_examples]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "slea.yaml")
    ap.add_argument("--batches", type=int, default=3, help="rollout batches (iterations' worth of episodes)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides")
    ap.add_argument("--examples", type=int, default=5, help="example lessons kept per extractor")
    ap.add_argument("--smoke", action="store_true", help="configs/smoke.yaml (tiny model), 1 batch: wiring check")
    ap.add_argument("--out", type=Path, default=None, help="output stem (default bench/results/llm_extraction)")
    args = ap.parse_args()
    config, batches, sets = args.config, args.batches, list(args.set)
    if args.smoke:
        config, batches = ROOT / "configs" / "smoke.yaml", 1
        sets = ["experience.mode=step", "experience.extract_max_new_tokens=16", *sets]
    stem = args.out or (OUT / ("llm_extraction_smoke" if args.smoke else "llm_extraction"))
    stem.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="slea_llm_extraction_") as tmp:
        cfg = load_config(config, [f"run.dir={tmp}", "eval.before=false", *sets])
        trainer = Trainer(cfg, Path(tmp))
        if trainer.experience is None:
            raise SystemExit("the config has no experience manager: set experience.mode (step or task)")
        try:
            trajs, rollout = collect(trainer, batches)
            results: dict[str, Any] = {
                "config": str(config.resolve().relative_to(ROOT)) if config.resolve().is_relative_to(ROOT)
                else str(config), "overrides": sets, "batches": batches, "model": cfg.model.name_or_path,
                "extractor_model": cfg.experience.extractor_model or "policy base (LoRA off)",
                "threads": cfg.run.threads, "extract_max_new_tokens": cfg.experience.extract_max_new_tokens,
                "extract_temperature": cfg.experience.extract_temperature, "k_traj": cfg.experience.k_traj,
                "eta": cfg.experience.eta, "eta_tie": cfg.experience.eta_tie, "rollout": rollout, "extractors": {}}
            for name in EXTRACTORS:
                res = run_extractor(name, cfg, trainer.experience.generate_text, trajs, args.examples)
                results["extractors"][name] = res
                print(f"{name}: {res['parsed_lessons']} lessons, {res['admitted']} admitted, "
                      f"{res['s_per_trajectory']:.3f} s/trajectory", flush=True)
        finally:
            trainer.experience.close()
            trainer.pool.close()
            trainer.log.close()
    results["ratios"] = ratios(results)
    results["wall_s"] = time.perf_counter() - t_start
    write(stem, results)
    print(f"wrote {stem.with_suffix('.json')} and {stem.with_suffix('.md')} in {results['wall_s'] / 60:.1f} min")


def ratios(results: dict[str, Any]) -> dict[str, float]:
    rule, llm = results["extractors"]["rule"], results["extractors"]["llm"]
    rollout_s = statistics.fmean(b["rollout_s"] for b in results["rollout"])
    n = max(1, len(results["rollout"]))
    return {"llm_over_rule_s_per_trajectory": llm["s_per_trajectory"] / max(rule["s_per_trajectory"], 1e-9),
            "llm_extract_over_rollout": llm["extract_s"] / n / rollout_s,
            "rule_extract_over_rollout": rule["extract_s"] / n / rollout_s,
            "mean_rollout_s": rollout_s}


def _cell(v) -> str:
    return "–" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))


def _written(total: int, model: int | None) -> str:
    """``total``, and in brackets how many of them the model wrote (``llm`` only)."""
    return f"{total}" if model is None else f"{total} ({model})"


def write(stem: Path, results: dict[str, Any]) -> None:
    atomic_write_text(stem.with_suffix(".json"), json.dumps(results, indent=2, ensure_ascii=False, default=str))
    ex, r = results["extractors"], results["ratios"]
    eps = sum(b["clean"] for b in results["rollout"])
    batches = "batch" if results["batches"] == 1 else "batches"
    lines = [f"# Experience extraction on real trajectories: `llm` vs `rule` ({results['model']})", "",
             (f"{eps} episodes of the untrained policy ({results['batches']} {batches} of `{results['config']}`"
             f"{', ' + ' '.join(results['overrides']) if results['overrides'] else ''}); per batch the trainer's "
             f"selection (top/bottom {results['k_traj']}, η = {results['eta']}, tie `{results['eta_tie']}`) and "
             f"admission into a fresh library. `llm` answered by {results['extractor_model']}, "
             f"{results['extract_max_new_tokens']} new tokens, temperature {results['extract_temperature']:g}, "
             f"{results['threads']} threads. Generated by bench/llm_extraction.py."), "",
             ("| extractor | prompts | raw lines | parsed lessons | trajectories with ≥ 1 lesson | fallbacks | candidates "
              "| admitted (model-written) | library (model-written) | s / trajectory |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in ex.items():
        fallbacks = _cell(e["fallbacks"])
        lines.append(f"| `{name}` | {e['prompts']} | {_cell(e['raw_lines'])} | {e['parsed_lessons']} | "
                     f"{e['trajectories_with_lesson']} / {e['selected_trajectories']} | {fallbacks} | "
                     f"{e['candidates']} | {_written(e['admitted'], e['admitted_model_written'])} | "
                     f"{_written(e['library_size'], e['library_model_written'])} | {e['s_per_trajectory']:.3g} |")
    lines += ["", f"Time: `llm` takes {_times(r['llm_over_rule_s_per_trajectory'])}× the rules' time per trajectory; "
              f"its extraction adds {100 * r['llm_extract_over_rollout']:.1f} % to a batch's rollout time "
              f"(rules: {100 * r['rule_extract_over_rollout']:.2f} %; rollout {r['mean_rollout_s']:.0f} s a batch "
              f"on this machine). Drops of `llm` answer lines: "
              + (", ".join(f"{k} {v}" for k, v in sorted(ex['llm']['drops'].items())) or "none") + ".", ""]
    lines += ["## `llm`: lessons the model wrote, next to its raw answer", ""]
    for e in ex["llm"]["examples"] or []:
        lines += [f"- **{e['text']}** ({e['task_type'] or 'task'}, {e['zone']}, {e['level']}, {e['status']})", "",
                  "  ```", *[
            f"  {x}" for x in _clip(e["raw"]).splitlines()], "  ```", ""]
    if not ex["llm"]["examples"]:
        lines += ["(none)", ""]
    if ex["llm"].get("answers_without_lesson"):
        lines += ["## `llm`: raw answers that yielded no lesson (the rules filled in)", ""]
        for e in ex["llm"]["answers_without_lesson"]:
            lines += [f"- {e['zone']}, {e['task_type'] or 'task'}:", "", "  ```",
                      *[f"  {x}" for x in _clip(e["raw"]).splitlines()], "  ```", ""]
    lines += ["## `rule`: example lessons", ""]
    lines += [f"- {e['text']} ({e['task_type'] or 'task'}, {e['zone']}, {e['level']}, {e['status']})"
              for e in ex["rule"]["examples"]] + [""]
    atomic_write_text(stem.with_suffix(".md"), "\n".join(lines))


def _times(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _clip(text: str, n: int = 500) -> str:
    text = text.replace("```", "'''")
    return text if len(text) <= n else text[:n] + " …"


if __name__ == "__main__":
    main()
