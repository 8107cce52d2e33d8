"""``slea agent``: a frozen model steered by an experience library, played with and without it on the same seeds.

No weight changes. Both conditions go through :func:`slea.evaluation.evaluate.evaluate` (the held-out loop of
training and ``slea eval``) on the same games: game ``g`` is env seed ``eval.seed + g`` and every episode draws
from its own random stream keyed by (evaluation, env seed, episode, turn), so the two conditions are paired
episode by episode and a difference comes from the library alone. The library condition retrieves per step
(``experience.mode: step``) or per episode (``task``) through :class:`slea.experience.manager.ExperienceManager`.

With ``evolve`` the library keeps learning while the agent plays: the games are played in rounds of ``batch``
games and after each round ``ExperienceManager.evolve`` (the training path: usage and success of the entries
used, split at η, extraction, admission) learns from that round's episodes before the next round plays. The
no-library condition plays the same rounds (the same games in the same generation batches) without a library.

With ``trace`` every step of every episode played, in both conditions, becomes one row (:func:`trace_rows`):
what the agent saw, answered and got, and the experiences retrieved for it with their text, looked up right after
the round that played it (before an evolution can replace them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slea.evaluation.evaluate import evaluate, summarize
from slea.evaluation.report import new_table
from slea.rollout.collector import RolloutCollector
from slea.types import Trajectory

if TYPE_CHECKING:
    from slea.config import EnvSection, EvalSection, RolloutSection

METRICS = ("success", "return", "invalid_rate", "episode_len", "retrieval_hit_rate")
MODES = ("sampled", "greedy")


def difference(without: dict[str, float], with_: dict[str, float]) -> dict[str, float]:
    """``with − without`` for each of :data:`METRICS` (summaries of :func:`summarize`)."""
    return {k: with_[k] - without[k] for k in METRICS}


def per_seed_success(trajs: Sequence[Trajectory]) -> dict[int, float]:
    """Env seed -> fraction of its episodes won."""
    won: dict[int, list[bool]] = {}
    for t in trajs:
        won.setdefault(int(t.seed if t.seed is not None else t.group_id), []).append(bool(t.won))
    return {s: sum(w) / len(w) for s, w in won.items()}


def paired_games(without: Sequence[Trajectory], with_: Sequence[Trajectory]) -> dict[str, int]:
    """Games (env seeds) whose success rate is higher, lower or the same with the library."""
    a, b = per_seed_success(without), per_seed_success(with_)
    out = {"better": 0, "worse": 0, "same": 0}
    for s in sorted(a.keys() & b.keys()):
        out["better" if b[s] > a[s] else "worse" if b[s] < a[s] else "same"] += 1
    return out


def extraction_summary(rounds: Sequence[dict[str, float]]) -> dict[str, float | None]:
    """What the LLM extractor made of the evolution rounds (their ``extract_*`` metrics): answers asked for,
    answers that gave at least one lesson (``parsed``), the parse rate ``parsed / answers`` (None without
    answers: the rule extractor wrote every lesson), rule fallbacks and failed generator calls."""
    total = {k: sum(r.get(f"extract_{k}", 0.0) for r in rounds)
             for k in ("llm_answers", "parsed", "fallback", "generate_errors")}
    return {"answers": total["llm_answers"], "parsed": total["parsed"],
            "parse_rate": total["parsed"] / total["llm_answers"] if total["llm_answers"] else None,
            "fallback": total["fallback"], "generate_errors": total["generate_errors"]}


def trace_rows(condition: str, trajs: Mapping[str, Sequence[Trajectory]], entry: Callable[[int], Any],
               *, round_: int = 0) -> list[dict[str, Any]]:
    """One row per step of ``trajs`` (decoding mode -> trajectories): the condition (``without`` / ``with``), the
    mode, the env seed, the trajectory and step, the observation the action was taken in (``anchor``), the
    parsed action and the raw answer, valid, reward, done, whether the episode was won in the end, the
    observation cluster and the retrieved experiences in prompt order as ``{id, zone, text}``. ``entry(id)``
    gives the library entry (anything with ``zone`` and ``text``) or None when it is gone (zone and text None)."""
    rows = []
    for mode, ts in trajs.items():
        for t in ts:
            for s in t.steps:
                exps = []
                for eid in s.experience_ids:
                    e = entry(eid)
                    exps.append({"id": int(eid), "zone": None if e is None else e.zone,
                                 "text": None if e is None else e.text})
                rows.append({"condition": condition, "mode": mode, "round": round_,
                             "seed": None if t.seed is None else int(t.seed), "traj_id": int(t.traj_id),
                             "step": int(s.step), "anchor": s.anchor, "action": s.action,
                             "response": s.response_text, "valid": bool(s.valid), "reward": float(s.reward),
                             "done": bool(s.done), "won": bool(t.won), "cluster_id": int(s.cluster_id),
                             "experiences": exps})
    return rows


def _rounds(seed: int, games: int, batch: int) -> list[tuple[int, int]]:
    """(first seed, games) of each round: ``games`` games from ``seed`` on, ``batch`` at a time."""
    return [(seed + g, min(batch, games - g)) for g in range(0, games, max(1, batch))]


def _play(collector, env_cfg: EnvSection, env_kwargs, eval_cfg: EvalSection, rounds, *, iteration, manager=None,
          trace=None) -> tuple[dict[str, list[Trajectory]], list[dict[str, float]]]:
    """Every round through ``evaluate``; with a ``manager`` the library evolves after each round. ``trace``:
    ``rows(round, trajectories by mode)``, called after each round is played and before the library evolves."""
    trajs: dict[str, list[Trajectory]] = {m: [] for m in MODES}
    evolved = []
    for r, (first, n) in enumerate(rounds):
        cfg = eval_cfg.model_copy(update={"seed": first, "games": n})
        res = evaluate(collector, env_cfg, env_kwargs, cfg, iteration=iteration + r, keep_trajectories=True)
        if trace is not None:
            trace(r, res["trajectories"])
        played = [t for m in MODES for t in res["trajectories"].get(m, [])]
        for m in MODES:
            trajs[m] += res["trajectories"].get(m, [])
        if manager is not None:
            evolved.append({"round": r, "seeds": [first, first + n - 1],
                            **manager.evolve(played, iteration=iteration + r)})
    return trajs, evolved


def next_iteration(manager) -> int:
    """An iteration after everything the library has seen (its entries' creation and last use), so that usage
    recorded now counts as the most recent (the admission's least-recently-used tie-break)."""
    its = [max(e.created_iter, e.last_used_iter) for e in manager.library.entries()]
    return max(its, default=-1) + 1


_warned_envs: set[tuple[tuple[str, ...], str]] = set()


def library_envs(provenance: Mapping[str, Any], entries: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """The env ids a library was built on: its own provenance's and those of its entries (a merged library may
    hold several), sorted; empty when none is recorded."""
    envs = {provenance.get("env")} | {(e.get("provenance") or {}).get("env") for e in entries}
    return sorted(e for e in envs if isinstance(e, str) and e)


def library_env_warning(sources: Sequence[str], target: str) -> str | None:
    """The warning for a library built on other envs than ``target`` (retrieval keys on the observation, so
    another env's entries rarely match), once per process for each (sources, target); None when it fits or was
    said already."""
    key = (tuple(sources), target)
    if not sources or target in sources or key in _warned_envs:
        return None
    _warned_envs.add(key)
    return (f"warning: the library was built on {', '.join(sources)} and is used on {target}: its lessons "
            f"describe another env's observations, so retrieval will rarely find one that fits")


def agent_overrides(model: str | None, settings: dict[str, Any], *, games: int | None = None,
                    episodes: int | None = None, seed: int | None = None) -> list[str]:
    """Config overrides of ``slea agent`` (before the user's ``--set``): the model without LoRA when it is not
    a run (``model`` None), retrieval from the first step (no warm-up, no minimum size: the library is given),
    the library's own capacities and thresholds, and the games to play."""
    over = [] if model is None else [f"model.name_or_path={model}", "model.lora=false"]
    over += ["experience.warmup_iters=0", "experience.min_entries=0"]
    over += [f"experience.{k}={settings[k]}" for k in ("capacity_pos", "capacity_neg", "novelty_threshold",
                                                       "cluster_threshold") if k in settings]
    return over + [f"eval.{k}={v}" for k, v in (("games", games), ("episodes_per_game", episodes),
                                                ("seed", seed)) if v is not None]


def run_agent(generator, builder, manager, env_kwargs: dict[str, Any], *, rollout: RolloutSection, env: EnvSection,
              eval_cfg: EvalSection, experience_mode: str, evolve: bool = False, batch: int = 1, say=None,
              trace: bool = False) -> dict[str, Any]:
    """Play ``eval_cfg`` (games, episodes per game, temperature, greedy) on ``env.id`` without the library,
    then with ``manager``'s library (evolving it after every ``batch`` games when ``evolve``); the result holds
    both summaries, their difference, the games each condition won more often, the library's size before and
    after, each evolution round's metrics and the env family's paper-style table with one row per condition.
    ``trace``: also ``steps``, the :func:`trace_rows` of every step played (without, then with the library)."""
    t0 = time.perf_counter()
    ev = eval_cfg
    rounds = _rounds(ev.seed, ev.games, batch if evolve else ev.games)
    base = next_iteration(manager)
    before = manager.library.summary()
    bare = RolloutCollector(generator, builder, rollout, env.max_steps)
    steered = RolloutCollector(generator, builder, rollout, env.max_steps, experience=manager,
                               experience_mode=experience_mode)
    say = say or (lambda _msg: None)
    steps: list[dict[str, Any]] = []

    def tracer(condition: str):
        if not trace:
            return None
        return lambda r, played: steps.extend(trace_rows(condition, played, manager.library.get, round_=r))

    say("without the library")
    off, _ = _play(bare, env, env_kwargs, ev, rounds, iteration=base, trace=tracer("without"))  # same batches
    say("with the library" + (f", evolving after every {batch} game(s)" if evolve else ""))
    stats0 = dict(manager.stats)
    on, evolved = _play(steered, env, env_kwargs, ev, rounds, iteration=base,
                        manager=manager if evolve else None, trace=tracer("with"))
    modes = [m for m in MODES if off[m]]
    out: dict[str, Any] = {"env": env.id, "games": ev.games, "seeds": [ev.seed, ev.seed + ev.games - 1],
                           "episodes_per_game": ev.episodes_per_game, "temperature": ev.temperature,
                           "experience_mode": experience_mode, "evolve": evolve, "batch": batch if evolve else None}
    out["without"] = {m: summarize(off[m]) for m in modes}
    out["with"] = {m: summarize(on[m]) for m in modes}
    out["difference"] = {m: difference(out["without"][m], out["with"][m]) for m in modes}
    out["games_by_success"] = {m: paired_games(off[m], on[m]) for m in modes}
    out["retrieval"] = {k: manager.stats[k] - stats0.get(k, 0) for k in manager.stats}
    out["library"] = {"before": before, "after": manager.library.summary(), "rounds": evolved}
    out["extraction"] = extraction_summary(evolved)
    table = new_table(env.id)
    for name, trajs in (("no library", off), ("library", on)):
        for m in modes:
            table.add(f"{name} {'sampled T=' + format(ev.temperature, 'g') if m == 'sampled' else m}", trajs[m])
    out["table"] = table.to_dict()
    out["wall_s"] = time.perf_counter() - t0
    if trace:
        out["steps"] = steps
    return out


def agent_table(res: dict[str, Any]):
    """The with/without-library comparison of ``slea agent`` as a rich table: one row per metric and mode."""
    from rich.table import Table

    t = Table(title=f"{res['env']}: {res['games']} games, with and without the library"
                    + (" (evolving)" if res["evolve"] else ""))
    for col in ("metric", "episodes", "no library", "library", "difference"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for mode, diff in res["difference"].items():
        for k in ("success", "return", "invalid_rate", "retrieval_hit_rate"):
            a, b = res["without"][mode][k], res["with"][mode][k]
            t.add_row(f"{mode} {k.replace('_', ' ')}", str(int(res["with"][mode]["episodes"])), f"{a:.3f}",
                      f"{b:.3f}", f"{diff[k]:+.3f}")
    lib = res["library"]
    by = ", ".join(f"{m}: {g['better']} better, {g['worse']} worse, {g['same']} same"
                   for m, g in res["games_by_success"].items())
    x = res.get("extraction") or {}
    lessons = (f"; lessons by the model: {int(x['parsed'])} of {int(x['answers'])} answers parsed "
               f"({x['parse_rate']:.0%}), the rest by the rules" if x.get("answers") else "")
    t.caption = (f"games with the library ({by}); library {int(lib['before']['size'])} -> "
                 f"{int(lib['after']['size'])} entries{lessons}; wall time {res['wall_s']:.0f} s")
    return t
