"""The rollout loop's cost over raw generation, and its speed-up over a naive per-env agent loop, on the
default job's rollout (configs/default.yaml: groups x group_size TextWorld episodes), each against a baseline
measured in the same run.

Per iteration ``it`` (env seeds ``rollout.sampling.iteration_seeds(run.seed, it, groups)``, as the trainer's):

1. **collector**: slea's :class:`~slea.rollout.collector.RolloutCollector` plays one episode on every env of
   the pool, through a timing proxy of the generator (:class:`TimedGenerator`: it records each batched call's
   prompt ids, keyword arguments (sampling keys included), wall time and answers; the library is not edited).
   Framework overhead = (collector wall − time inside generation) / time inside generation; env time is part
   of it (and reported on its own: ``overhead_excl_env``).
2. **replay** ("raw generation on the same prompts"): every recorded call again, straight through the same
   generator with the same arguments and sampling keys. Overhead vs replay = (collector wall − replay) /
   replay; ``replay.identical_answers`` counts answers that came out token for token the same.
3. **naive**: a simple agent loop written here, one episode at a time: for each env in turn, reset it with its
   group's seed, then per turn build the prompt (same PromptBuilder and agent view), generate for that one
   prompt (batch of 1; same generator, max tokens, temperature, stopping and sampling keys as the
   collector's), parse it (same parser and fuzzy cut-off; an invalid answer does not step the env) and step
   the env (the same pool's ``step_one``, with its fault guard), until the episode ends or ``env.max_steps``
   turns. Speed-up = naive wall / collector wall. ``naive.same_actions_episodes``: episodes whose action
   sequence equals the collector's (batch-1 numerics differ from batched ones in the last bf16 bits, so some
   diverge).

Before each iteration the pool is reset once, untimed: a TextWorld env starts its interpreter on first use and
loads a game file when its game changes, the same work for both loops, paid here by neither. No training
between iterations (the weights stay the initial ones). Writes bench/results/rollout_overhead.json and prints
a table.

    .venv/bin/python bench/rollout_overhead.py [--config configs/default.yaml] [--iterations 4]
        [--model embedded|tiny] [--set KEY=VALUE ...] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slea.config import RunConfig, load_config
from slea.envs.factory import make_pool
from slea.envs.pool import EnvPool
from slea.policy.engines import make_generator
from slea.policy.model import load_policy
from slea.policy.prompt_builder import PromptBuilder, parse_action
from slea.rollout.collector import TRAIN_SALT, RolloutCollector, clean_text
from slea.rollout.sampling import iteration_seeds
from slea.rollout.view import AgentView
from slea.trainer.lifecycle import seed_everything

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "rollout_overhead.json"
TARGET_OVERHEAD = 0.10  # target: rollout loop overhead <= 10 % over raw generation
TARGET_SPEEDUP = 2.0  # target: >= 2x a naive per-env loop
TINY = ["model.name_or_path=tiny", "model.dtype=float32", "model.lora_layers=null"]


@dataclass
class Call:
    """One batched generation call as the collector made it."""

    prompts: list[list[int]]
    kwargs: dict[str, Any]
    seconds: float
    answers: list[list[int]]


class TimedGenerator:
    """A proxy of a generator that times and records every ``generate`` call; everything else is forwarded."""

    def __init__(self, inner):
        self.inner = inner
        self.log: list[Call] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def generate(self, prompts, **kwargs):
        t0 = time.perf_counter()
        out = self.inner.generate(prompts, **kwargs)
        seconds = time.perf_counter() - t0
        self.log.append(Call([list(p) for p in prompts], dict(kwargs), seconds, [list(o.ids) for o in out]))
        return out


@dataclass
class Setup:
    """The pieces the trainer wires for its rollouts (slea/trainer/rl.py), built once and shared by all three
    measurements."""

    cfg: RunConfig
    generator: Any
    builder: PromptBuilder
    pool: EnvPool
    proxy: TimedGenerator = field(init=False)
    collector: RolloutCollector = field(init=False)

    def __post_init__(self) -> None:
        self.proxy = TimedGenerator(self.generator)
        self.collector = RolloutCollector(self.proxy, self.builder, self.cfg.rollout, self.cfg.env.max_steps)


def build(cfg: RunConfig) -> Setup:
    """Model, generator, prompt builder and env pool as ``Trainer.__init__`` builds them (no experience
    library: the default job's GRPO runs without one), then one warm-up call (the newline-token table is built
    on first use)."""
    torch.set_num_threads(cfg.run.threads)
    seed_everything(cfg.run.seed)
    model, tok = load_policy(cfg.model)
    gen = make_generator(cfg.model, model, tok)
    builder = PromptBuilder.from_rollout(tok, cfg.rollout)
    pool = make_pool(cfg.env, cfg.rollout.groups, cfg.rollout.group_size)
    gen.generate([tok("warm up").input_ids], max_new_tokens=2, stop_at_newline=True)
    return Setup(cfg, gen, builder, pool)


# -- the three measurements ---------------------------------------------------------------------------------
def run_collector(s: Setup, it: int) -> dict[str, Any]:
    """One collector episode per env of the pool; the calls it made are left in ``s.proxy.log``."""
    s.proxy.log.clear()
    seeds = iteration_seeds(s.cfg.run.seed, it, s.cfg.rollout.groups)
    s.pool.reset(seeds)  # untimed: each env loads this iteration's game, which both loops then find loaded
    t0, c0 = time.perf_counter(), time.process_time()
    trajs, stats = s.collector.collect(s.pool, seeds, iteration=it)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall_s": wall, "cpu_s": cpu, "generation_s": sum(c.seconds for c in s.proxy.log),
            "env_s": stats.env_s,
            "calls": len(s.proxy.log), "prompts": sum(len(c.prompts) for c in s.proxy.log),
            "prompt_tokens": stats.prompt_tokens, "gen_tokens": stats.gen_tokens, "episodes": len(trajs),
            "env_steps": sum(len(t.steps) for t in trajs), "wins": sum(t.won for t in trajs),
            "call_s": [c.seconds for c in s.proxy.log],
            "actions": [[st.action for st in t.steps] for t in trajs]}


def replay(s: Setup, calls: list[Call]) -> dict[str, Any]:
    """Every recorded call again, straight through the generator with the same arguments."""
    times, same, rows = [], 0, 0
    c0 = time.process_time()
    for c in calls:
        t0 = time.perf_counter()
        out = s.generator.generate(c.prompts, **c.kwargs)
        times.append(time.perf_counter() - t0)
        same += sum(list(o.ids) == a for o, a in zip(out, c.answers))
        rows += len(out)
    return {"seconds": sum(times), "cpu_s": time.process_time() - c0, "calls": len(calls), "identical": same,
            "rows": rows, "call_s": times}


def naive_episode(s: Setup, i: int, seed: int, copy: int) -> dict[str, Any]:
    """One episode of env ``i`` the simple way: prompt, one batch-1 generation, parse, step, until it ends."""
    cfg, pool = s.cfg, s.pool
    ro = cfg.rollout
    gen_s = env_s = 0.0
    t0 = time.perf_counter()
    obs, info = pool.reset_one(i, seed)
    env_s += time.perf_counter() - t0
    view, instr, actions = AgentView.start(obs, info), pool.instructions, []
    stop = not instr.multiline if ro.stop_at_newline is None else ro.stop_at_newline
    key = (TRAIN_SALT, int(seed) % 2**63, copy)
    for turn in range(cfg.env.max_steps if "fault" not in info else 0):
        prompt = s.builder.encode(view.messages(s.builder, instr))
        t0 = time.perf_counter()
        (out,) = s.generator.generate([prompt], max_new_tokens=ro.max_new_tokens, temperature=ro.temperature,
                                      top_p=ro.top_p, top_k=ro.top_k, rng_keys=[(*key, turn)],
                                      stop_at_newline=stop)
        gen_s += time.perf_counter() - t0
        text = clean_text(out.text)
        action, _ = parse_action(text, view.info.get("admissible_actions"), ro.fuzzy_cutoff)
        actions.append(action or "")
        if action is None:
            view.advance(text, None, view.obs, dict(view.info, invalid=True))
            continue
        t0 = time.perf_counter()
        obs, _, term, trunc, info = pool.step_one(i, action)
        env_s += time.perf_counter() - t0
        view.advance(text, action, obs, info)
        if term or trunc:
            break
    return {"gen_s": gen_s, "env_s": env_s, "calls": len(actions), "actions": actions}


def run_naive(s: Setup, it: int) -> dict[str, Any]:
    """:func:`naive_episode` on every env of the pool in turn, with the collector's seeds and copy numbers."""
    seeds = iteration_seeds(s.cfg.run.seed, it, s.cfg.rollout.groups)
    t0, c0 = time.perf_counter(), time.process_time()
    eps = [naive_episode(s, i, seeds[s.pool.group_of(i)], i - s.pool.members(s.pool.group_of(i)).start)
           for i in range(len(s.pool))]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall_s": wall, "cpu_s": cpu, "generation_s": sum(e["gen_s"] for e in eps),
            "env_s": sum(e["env_s"] for e in eps),
            "calls": sum(e["calls"] for e in eps), "episodes": len(eps),
            "env_steps": sum(e["calls"] for e in eps), "actions": [e["actions"] for e in eps]}


# -- figures ------------------------------------------------------------------------------------------------
def _sum(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows)


def figures(col: list[dict], rep: list[dict], nai: list[dict]) -> dict[str, float]:
    """The ratios, each against its baseline of the same run, over all iterations together."""
    wall, gen, env = _sum(col, "wall_s"), _sum(col, "generation_s"), _sum(col, "env_s")
    replay_s, naive_s = _sum(rep, "seconds"), _sum(nai, "wall_s")
    return {"overhead_vs_generation": (wall - gen) / gen, "overhead_vs_replay": (wall - replay_s) / replay_s,
            "overhead_excl_env": (wall - gen - env) / gen, "env_share": env / wall,
            "speedup_vs_naive": naive_s / wall,
            "naive_generation_vs_batched": _sum(nai, "generation_s") / gen}


def summarise(col: list[dict], rep: list[dict], nai: list[dict]) -> dict[str, Any]:
    """Totals of every measurement, the figures (pooled over the iterations, and each iteration's: their
    spread shows a disturbed iteration), the targets and per-iteration rows (actions dropped).
    ``cpu_per_wall``: process CPU seconds per wall second, about ``run.threads`` when the bench had the cores
    to itself."""
    same = sum(a == b for c, n in zip(col, nai) for a, b in zip(c["actions"], n["actions"]))
    keys = ("wall_s", "cpu_s", "generation_s", "env_s", "calls", "prompts", "prompt_tokens", "gen_tokens",
            "episodes", "env_steps", "wins")
    collector = {k: _sum(col, k) for k in keys}
    collector["other_s"] = collector["wall_s"] - collector["generation_s"] - collector["env_s"]
    naive = {k: _sum(nai, k) for k in ("wall_s", "cpu_s", "generation_s", "env_s", "calls", "episodes",
                                       "env_steps")}
    naive["same_actions_episodes"] = same
    rplay = {"seconds": _sum(rep, "seconds"), "cpu_s": _sum(rep, "cpu_s"), "calls": _sum(rep, "calls"),
             "identical_answers": _sum(rep, "identical"), "answers": _sum(rep, "rows")}
    for m, wall in ((collector, "wall_s"), (naive, "wall_s"), (rplay, "seconds")):
        m["cpu_per_wall"] = m["cpu_s"] / m[wall]
    fig = figures(col, rep, nai)
    each = [figures([c], [r], [n]) for c, r, n in zip(col, rep, nai)]
    spread = {k: [min(f[k] for f in each), max(f[k] for f in each)] for k in fig}
    strip = [{k: v for k, v in r.items() if k != "actions"} for r in col]
    return {"collector": collector, "replay": rplay, "naive": naive, "figures": fig, "figures_range": spread,
            "targets": {"overhead_max": TARGET_OVERHEAD,
                        "overhead_met": fig["overhead_vs_generation"] <= TARGET_OVERHEAD,
                        "speedup_min": TARGET_SPEEDUP,
                        "speedup_met": fig["speedup_vs_naive"] >= TARGET_SPEEDUP},
            "per_iteration": [{"figures": f, "collector": c, "replay_s": r["seconds"],
                               "replay_call_s": r["call_s"], "naive_s": n["wall_s"],
                               "naive_generation_s": n["generation_s"]}
                              for f, c, r, n in zip(each, strip, rep, nai)]}


def table(res: dict[str, Any]) -> str:
    """The printed table: one line per comparison."""
    c, r, n, f = res["collector"], res["replay"], res["naive"], res["figures"]
    rows = [("collector wall vs time inside generation", c["wall_s"], c["generation_s"],
             f"{100 * f['overhead_vs_generation']:+.1f} %"),
            ("  the same without env time", c["wall_s"] - c["env_s"], c["generation_s"],
             f"{100 * f['overhead_excl_env']:+.1f} %"),
            ("collector wall vs replayed generation", c["wall_s"], r["seconds"],
             f"{100 * f['overhead_vs_replay']:+.1f} %"),
            ("naive per-env loop vs collector", n["wall_s"], c["wall_s"], f"{f['speedup_vs_naive']:.2f}x")]
    lo = res["figures_range"]
    spans = [f"{100 * lo[k][0]:+.1f} .. {100 * lo[k][1]:+.1f} %" for k in
             ("overhead_vs_generation", "overhead_excl_env", "overhead_vs_replay")]
    spans.append(f"{lo['speedup_vs_naive'][0]:.2f} .. {lo['speedup_vs_naive'][1]:.2f}x")
    lines = [f"{'measurement':44s} {'measured':>9s} {'baseline':>9s} {'figure':>9s}  per iteration"]
    lines += [f"{name:44s} {a:8.2f}s {b:8.2f}s {fig:>9s}  {span}"
              for (name, a, b, fig), span in zip(rows, spans)]
    lines.append(f"episodes {c['episodes']} (naive {n['episodes']}), env steps {c['env_steps']} (naive "
                 f"{n['env_steps']}), same actions {n['same_actions_episodes']}/{n['episodes']}, "
                 f"replay identical {r['identical_answers']}/{r['answers']}; CPU s per wall s: collector "
                 f"{c['cpu_per_wall']:.2f}, replay {r['cpu_per_wall']:.2f}, naive {n['cpu_per_wall']:.2f}")
    return "\n".join(lines)


def measure(cfg: RunConfig, iterations: int) -> dict[str, Any]:
    """The three measurements, interleaved per iteration (collector, its replay, the naive loop)."""
    s = build(cfg)
    col, rep, nai = [], [], []
    try:
        for it in range(iterations):
            col.append(run_collector(s, it))
            rep.append(replay(s, list(s.proxy.log)))
            nai.append(run_naive(s, it))
    finally:
        s.pool.close()
    return summarise(col, rep, nai)


def _shown(path: str) -> str:
    """A config path as the JSON records it: relative to the repository when inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--model", choices=("embedded", "tiny"), default="embedded")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config overrides, as `slea train --set`")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    overrides = (TINY if args.model == "tiny" else ["model.name_or_path=embedded"]) + args.overrides
    cfg = load_config(args.config, overrides)
    load = os.getloadavg()
    res = measure(cfg, args.iterations)
    if not all(math.isfinite(v) for v in res["figures"].values()):
        raise SystemExit(f"non-finite figures: {res['figures']}")
    doc = {"date": dt.date.today().isoformat(), "config": _shown(args.config), "overrides": overrides,
           "model": args.model, "iterations": args.iterations, "threads": cfg.run.threads,
           "loadavg_1min": {"start": round(load[0], 2), "end": round(os.getloadavg()[0], 2)},
           "rollout": {"groups": cfg.rollout.groups, "group_size": cfg.rollout.group_size,
                       "max_steps": cfg.env.max_steps, "max_new_tokens": cfg.rollout.max_new_tokens,
                       "history": cfg.rollout.history, "env": cfg.env.id}, **res}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(table(res))
    return doc


if __name__ == "__main__":
    main()
