"""One iteration's metrics row (metrics.jsonl, TensorBoard), assembled from what each phase returned.

Keys are ``section/name``: ``train/*`` (success, return, invalid rate, episode length of every episode played),
``adv/*``, ``collapse/*`` (equal-return task groups, distinct first actions: slea.evaluation.collapse; ``groups``,
the task groups of two or more episodes those are taken over),
``budget/*`` (this iteration's rollouts and env steps, RTPO's siblings included), ``rollout/*``
(what the rollout scheme reports; ``rollout/retokenized``: generated rows whose trained token ids differ from
the ids the engine consumed or produced, which must stay 0; ``rollout/entropy``: the mean token entropy of the
sampled responses' distributions, from the generation logits), ``faults/*``, ``guard/*``, ``sampling/*``
(DAPO), ``library/*``, ``update/*`` (loss, clip fraction, ratio deviation, grad norm, KL, the trained tokens'
entropy), ``critic/*``, ``tokens/*``, ``time/*``, ``throughput/*``, and the run's
``episodes`` / ``env_steps`` / ``rollouts`` so far.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from slea.evaluation.collapse import collapse_metrics
from slea.evaluation.evaluate import summarize
from slea.types import Trajectory

if TYPE_CHECKING:
    from slea.rollout.collector import RolloutStats


@dataclass
class Phases:
    """What one iteration's phases produced, for :func:`iteration_metrics`."""

    played: list[Trajectory]  # every episode played (dynamic sampling's dropped groups included)
    clean: int  # episodes not ended by an env fault
    rollout: RolloutStats
    sampling: dict[str, float]
    faults: dict[str, int]
    advantages: np.ndarray
    nonfinite_rewards: int
    nonfinite_advantages: int
    bad_update_streak: int
    library: dict[str, float] = field(default_factory=dict)
    update: dict[str, float] = field(default_factory=dict)
    critic: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # rollout, advantages, library, train, iteration
    rollouts: int = 0  # rollouts played this iteration (episodes and forked continuations)
    env_steps: int = 0  # env steps played this iteration
    max_new_tokens: int = 0  # rollout.max_new_tokens: a response this long was cut there (0: unknown)
    lr: float | None = None  # the optimizer's learning rate during this iteration's update


def group_collapse(played: list[Trajectory]) -> dict[str, float]:
    """``collapse/*`` of the episodes an update learns from (slea.evaluation.collapse), and ``collapse/groups``: how
    many task groups of two or more episodes ``equal_return_frac`` is the share of."""
    sizes = Counter(t.group_id for t in played)
    return {**{f"collapse/{k}": v for k, v in collapse_metrics(played).items()},
            "collapse/groups": float(sum(1 for n in sizes.values() if n >= 2))}


def no_update_line(row: dict[str, float]) -> str | None:
    """Why a step trained nothing, in one line, when every task group's episodes returned the same (a group-relative
    estimator then has no signal: every advantage is 0), e.g. ``no update: all 3 groups had equal returns
    (collapse/equal_return_frac 1.0)``; None when some group's returns differed (or none had two episodes)."""
    frac, groups = row.get("collapse/equal_return_frac"), int(row.get("collapse/groups", 0))
    if not isinstance(frac, float) or not frac >= 1.0 or groups < 1:
        return None
    which = f"all {groups} groups" if groups > 1 else "its one group"
    return f"no update: {which} had equal returns (collapse/equal_return_frac {frac:.1f})"


# update/critic metrics that add up over an iteration's rounds (the others are averaged over the rounds)
SUMMED = ("skipped_updates", "trained_tokens", "trained_samples")


def sum_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Key-wise sums of several rounds' counts (sampling counts, rollout counts, seconds)."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + float(v)
    return out


# library metrics that describe the library's state after a round (the others are per-round counts and seconds)
LIBRARY_STATE = ("size", "clusters", "clusters_linked", "embedder_failed", "cluster_members", "cluster_singletons")


def merge_library(rounds: list[dict[str, float]]) -> dict[str, float]:
    """One iteration's library metrics from its rounds': admission counts and seconds summed; the library's
    state (sizes, clusters, a failed embedder) as the last round left it, never a sum of snapshots."""
    out: dict[str, float] = {}
    for r in rounds:
        for k, v in r.items():
            state = k in LIBRARY_STATE or k.startswith("size_")
            out[k] = float(v) if state else out.get(k, 0.0) + float(v)
    return out


def merge_updates(rounds: list[dict[str, float]]) -> dict[str, float]:
    """One iteration's update (or critic) metrics from its rounds': counts summed, maxima kept, the rest the
    mean over the rounds that report it."""
    out: dict[str, float] = {}
    seen: dict[str, int] = {}
    for r in rounds:
        for k, v in r.items():
            if k in SUMMED:
                out[k] = out.get(k, 0.0) + v
            elif k.endswith("_max_dev"):
                out[k] = max(out.get(k, v), v)
            else:
                out[k] = out.get(k, 0.0) + v
                seen[k] = seen.get(k, 0) + 1
    return {k: v / seen[k] if k in seen else v for k, v in out.items()}


def response_metrics(trajs: list[Trajectory], max_new_tokens: int) -> dict[str, float]:
    """The generated answers' length in tokens over every step row of ``trajs``: ``length_mean``, ``length_max``
    and ``clipped_frac``, the fraction as long as ``max_new_tokens`` (generation stopped by the limit, not by a
    stop token: verl's ``response_length/clip_ratio``); empty when no step generated anything."""
    lengths = np.asarray([len(s.response_ids) for t in trajs for s in t.steps if s.response_ids], dtype=np.int64)
    if not lengths.size:
        return {}
    out = {"length_mean": float(lengths.mean()), "length_max": float(lengths.max())}
    if max_new_tokens > 0:
        out["clipped_frac"] = float((lengths >= max_new_tokens).mean())
    return out


def iteration_metrics(p: Phases, episodes: int, env_steps: int, rollouts: int | None = None) -> dict[str, float]:
    adv = p.advantages[np.isfinite(p.advantages)] if p.advantages.size else p.advantages
    r = p.rollout
    trained = p.update.get("trained_tokens", 0.0)
    m: dict[str, float] = {f"train/{k}": v for k, v in summarize(p.played).items()}
    m["adv/abs_mean"] = float(np.abs(adv).mean()) if adv.size and not p.nonfinite_advantages else 0.0
    m.update({f"faults/{k}": float(v) for k, v in p.faults.items()})
    m["faults/dropped_episodes"] = float(len(p.played) - p.clean)
    m["guard/nonfinite_rewards"] = float(p.nonfinite_rewards)
    m["guard/nonfinite_advantages"] = float(p.nonfinite_advantages)
    m["guard/bad_update_streak"] = float(p.bad_update_streak)
    m.update(p.sampling)
    m["rollout/retokenized"] = float(getattr(r, "retokenized", 0))
    if getattr(r, "entropy_tokens", 0):  # engines that report the sampling distribution's entropy
        m["rollout/entropy"] = r.entropy_sum / r.entropy_tokens
    m.update({f"response/{k}": v for k, v in response_metrics(p.played, p.max_new_tokens).items()})
    m.update(group_collapse(p.played))
    m.update({f"library/{k}": float(v) for k, v in p.library.items()})
    m.update({f"update/{k}": v for k, v in p.update.items()})
    if p.lr is not None:
        m["update/lr"] = float(p.lr)
    m.update({f"critic/{k}": v for k, v in p.critic.items()})
    train_s = p.seconds.get("train", 0.0)
    m.update({
        "tokens/prompt": float(r.prompt_tokens), "tokens/generated": float(r.gen_tokens), "tokens/trained": trained,
        "time/generation_s": r.gen_s, "time/env_s": r.env_s, "time/retrieval_s": r.retrieval_s,
        "time/rollout_s": p.seconds.get("rollout", 0.0), "time/advantages_s": p.seconds.get("advantages", 0.0),
        "time/library_s": p.seconds.get("library", 0.0), "time/train_s": train_s,
        "time/iteration_s": p.seconds.get("iteration", 0.0),
        "throughput/train_tokens_per_s": trained / max(train_s, 1e-9),
        "episodes": float(episodes), "env_steps": float(env_steps),
        "rollouts": float(episodes if rollouts is None else rollouts),
        "budget/rollouts": float(p.rollouts), "budget/env_steps": float(p.env_steps),
    })
    return m
