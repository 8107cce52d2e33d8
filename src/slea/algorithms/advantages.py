"""Advantage estimators over flat step rows: GRPO, Dr.GRPO, RLOO, REINFORCE++, GiGPO and SLEA-RL.

Every estimator is a pure function of a :class:`~slea.algorithms.batch.StepBatch` registered with its spec
(:func:`~slea.algorithms.registry.register_algorithm`) and returns one float64 per row; the trainer broadcasts
it to that row's response tokens. Functional entry point over plain columns::

    compute_advantages(name, group_ids, traj_ids, steps, rewards, anchors=None, clusters=None,
                       *, gamma=0.95, step_weight=1.0, std_norm=True, eps=1e-6, **options)

Semantics (docs/algorithms.md is the index; docs/algorithms/<name>.md has one page per estimator):

* a *trajectory* is a ``(group_id, traj_id)`` pair; its rows are ordered by ``steps``; rows may come in any
  order and the result is in the input row order;
* episode return ``R = Σ_t r_t`` (sum of the trajectory's per-step rewards);
* episode-level statistics are taken over the group's *trajectories* (not its rows), with the unbiased
  std (ddof=1); a group, or a step group, of size 1 gets advantage 0 at that level; a group whose values are
  all equal gets exactly 0 (values are shifted by a group member before averaging, so no rounding residue);
* discounted step return ``R̂_t = Σ_{k≥t} γ^{k−t} r_k`` (GiGPO Eq.5, SLEA-RL §3), over the trajectory's rows in
  ``steps`` order (the discount counts rows, so gaps in ``steps`` do not add discount).

Performance: everything is vectorised. The rows are factorised once (integer ids through a lookup table or
one sort; string anchors through a C-level dict pass), sorted once by (trajectory, step), and group
statistics are ``np.bincount`` sums. The discounted return is a reverse segmented scan that iterates over the
*turn index* (``max T`` numpy steps, each over the trajectories that are that long), never over rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from slea.algorithms.batch import StepBatch, estimate
from slea.algorithms.registry import get_algorithm, register_algorithm
from slea.algorithms.rows import (
    RowIndex,
    anchor_groups,
    as_rewards,
    cluster_groups,
    index_rows,
    similarity_groups,
)

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = [
    "RowIndex",
    "anchor_groups",
    "cluster_groups",
    "compute_advantages",
    "discounted_returns",
    "episode_returns",
    "group_normalize",
    "index_rows",
    "leave_one_out",
    "similarity_groups",
    "whiten",
]


# --------------------------------------------------------------------------------------------------------- #
# The equations: small pure functions                                                                       #
# --------------------------------------------------------------------------------------------------------- #


def _shifted(values: np.ndarray, codes: np.ndarray, m: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x, count, sum_x, ref)`` with ``x = values − ref[codes]``, ``ref`` some member of each group.

    Shifting by a member makes every statistic of an all-equal group exactly 0 (no ``mean`` rounding residue)
    and keeps the variance numerically stable for large offsets.
    """
    ref = np.empty(m, dtype=np.float64)
    ref[codes] = values
    x = values - ref[codes]
    return x, np.bincount(codes, minlength=m), np.bincount(codes, weights=x, minlength=m), ref


def group_normalize(
    values: np.ndarray,
    codes: np.ndarray,
    n_codes: int | None = None,
    *,
    std_norm: bool = True,
    eps: float = 1e-6,
    singleton: str = "zero",
    at: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Group-relative advantage ``(v − mean_g) / (std_g + eps)``, or ``v − mean_g`` when ``std_norm`` is false.

    GRPO (Shao et al. 2024, DeepSeekMath §4.1.2 outcome supervision; objective Eq. 3); GiGPO Eq.3 (episode level, over the N
    trajectories of a task group) and Eq.7 (step level, over an anchor-state group), where ``F_norm ∈ {std, 1}``
    is ``std_norm``; SLEA-RL Eq.5 (over an observation cluster); Dr.GRPO (Liu et al. 2025) drops the std.
    ``std`` is the unbiased sample std (ddof=1, as ``torch.std``). A group whose values are all equal gets
    exactly 0. A group of one member gets 0 (``singleton="zero"``), or, as the GiGPO/verl reference code's
    episode level (mean 0, std 1), ``v / (1 + eps)`` (``v`` without the std) with ``singleton="reference"``.

    ``at=(values_at, codes_at)`` applies the statistics of ``values`` (grouped by ``codes``) to other values, e.g.
    per-row scores normalised by per-trajectory statistics; the result is then one per ``values_at``.
    """
    v = np.asarray(values, dtype=np.float64)
    c = np.asarray(codes, dtype=np.int64)
    m = int(c.max()) + 1 if n_codes is None and len(c) else int(n_codes or 0)
    tv = v if at is None else np.asarray(at[0], dtype=np.float64)
    tc = c if at is None else np.asarray(at[1], dtype=np.int64)
    if len(tv) == 0:
        return np.zeros(0, np.float64)
    x, cnt, sx, ref = _shifted(v, c, m)
    mean = sx / np.maximum(cnt, 1)
    dev = (tv - ref[tc]) - mean[tc]
    if std_norm:
        own = x - mean[c]
        var = np.bincount(c, weights=own * own, minlength=m) / np.maximum(cnt - 1, 1)
        std = np.sqrt(var)[tc]
        with np.errstate(divide="ignore", invalid="ignore"):
            adv = np.where(std > 0, dev / (std + eps), 0.0)
    else:
        adv = dev
    single = cnt[tc] < 2
    adv[single] = _singleton(tv[single], singleton, std_norm=std_norm, eps=eps)
    return adv


def _singleton(values: np.ndarray, rule: str, *, std_norm: bool, eps: float) -> np.ndarray:
    """The advantage of a group's only member: 0 (``"zero"``), or the reference code's mean-0/std-1 rule."""
    if rule == "zero":
        return np.zeros_like(values)
    if rule == "reference":
        return values / (1.0 + eps) if std_norm else values.copy()
    raise ValueError(f"singleton must be 'zero' or 'reference', got {rule!r}")


def leave_one_out(
    values: np.ndarray,
    codes: np.ndarray,
    n_codes: int | None = None,
    *,
    singleton: str = "zero",
    at: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """RLOO baseline: ``A_i = R_i − mean_{j≠i} R_j`` over the members of ``R_i``'s group.

    Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free!"; Ahmadian et al. 2024 (RLOO for
    LLMs). Equals ``G/(G−1)·(R_i − mean)`` (GiGPO App. C). A group of one member gets 0, or its own value
    (``singleton="reference"``: verl's RLOO leaves a lone sample's score as it is).

    ``at=(values_at, member_at)``: other values, each belonging to member ``member_at[k]`` of ``values``, get
    that member's leave-one-out baseline (a trajectory's rows scored against the other trajectories).
    """
    v = np.asarray(values, dtype=np.float64)
    c = np.asarray(codes, dtype=np.int64)
    m = int(c.max()) + 1 if n_codes is None and len(c) else int(n_codes or 0)
    member = np.arange(len(v)) if at is None else np.asarray(at[1], dtype=np.int64)
    tv = v if at is None else np.asarray(at[0], dtype=np.float64)
    if len(tv) == 0:
        return np.zeros(0, np.float64)
    x, cnt, sx, ref = _shifted(v, c, m)
    g = c[member]
    k = cnt[g]
    with np.errstate(divide="ignore", invalid="ignore"):
        adv = np.where(k > 1, (tv - ref[g]) - (sx[g] - x[member]) / np.maximum(k - 1, 1), 0.0)
    single = k < 2
    adv[single] = _singleton(tv[single], singleton, std_norm=False, eps=0.0)
    return adv


def whiten(values: np.ndarray, *, std_norm: bool = True, eps: float = 1e-6) -> np.ndarray:
    """``(v − mean(v)) / (std(v) + eps)`` over the whole batch: :func:`group_normalize` with one group
    (REINFORCE++'s global normalisation, Hu 2025; PPO's advantage whitening, verl ``masked_whiten``). Unbiased
    std; fewer than two values, or all equal, give 0."""
    v = np.asarray(values, dtype=np.float64)
    return group_normalize(v, np.zeros(len(v), np.int64), 1, std_norm=std_norm, eps=eps)


def _episode_returns(rows: RowIndex, rewards: np.ndarray) -> np.ndarray:
    """Per trajectory code: ``R(τ) = Σ_t r_t``."""
    return np.bincount(rows.traj, weights=rewards, minlength=rows.n_traj)


def episode_returns(traj_ids: Any, rewards: Any, group_ids: Any | None = None) -> np.ndarray:
    """Per row, the episode return ``R(τ) = Σ_t r_t`` of the row's trajectory (GiGPO Eq.3's R(τ_i)).

    A trajectory is a ``traj_id`` (or a ``(group_id, traj_id)`` pair when ``group_ids`` is given).
    """
    t = np.asarray(traj_ids)
    rows = index_rows(np.zeros(len(t), np.int64) if group_ids is None else group_ids, t, None)
    r = as_rewards(rewards, rows.n)
    per_row: np.ndarray = _episode_returns(rows, r)[rows.traj]
    return per_row


def discounted_returns(
    traj_ids: Any, steps: Any, rewards: Any, gamma: float = 0.95, group_ids: Any | None = None
) -> np.ndarray:
    """Per row, ``R̂_t = Σ_{k≥t} γ^{k−t} r_k`` over the row's trajectory, rows ordered by ``steps``.

    GiGPO Eq.5; SLEA-RL §3 ("step returns"); with a sparse episode reward on the last turn,
    ``R̂_t = γ^{T−t}·R``. Linear: a reverse segmented scan over the turn index (:meth:`RowIndex.reverse_scan`).
    """
    t = np.asarray(traj_ids)
    rows = index_rows(np.zeros(len(t), np.int64) if group_ids is None else group_ids, t, steps)
    _check_gamma(gamma)
    return rows.reverse_scan(as_rewards(rewards, rows.n), float(gamma))


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


# --------------------------------------------------------------------------------------------------------- #
# Registered algorithms (the critic-based ones, ppo and turn_ppo, are in slea/algorithms/gae.py)            #
# --------------------------------------------------------------------------------------------------------- #


def _episode_scores(batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
    """``(per trajectory, per row)`` episode scores. Without invalid-action penalties both are ``R(τ)``; with
    them (``StepBatch.penalties``, the reference code's placement) a row scores ``R(τ) − p_t`` (its own
    penalty only, nothing propagated) and a trajectory ``R(τ) − mean_t p_t`` (its rows' mean score)."""
    rows = batch.rows
    ret = _episode_returns(rows, batch.rewards)
    if batch.penalties is None:
        return ret, ret[rows.traj]
    pen = batch.penalties
    mean_pen = np.bincount(rows.traj, weights=pen, minlength=rows.n_traj) / np.maximum(
        np.bincount(rows.traj, minlength=rows.n_traj), 1)
    return ret - mean_pen, ret[rows.traj] - pen


def _group_relative(batch: StepBatch, *, std_norm: bool, eps: float, cross_step_stats: bool,
                    singleton: str) -> np.ndarray:
    """GiGPO Eq.3 / GRPO per row: statistics over the task group's trajectories, or over its step rows with
    ``cross_step_stats`` (the reference code's ``compute_mean_std_cross_steps=True``)."""
    rows = batch.rows
    per_traj, per_row = _episode_scores(batch)
    if cross_step_stats:
        return group_normalize(per_row, rows.group, rows.n_groups, std_norm=std_norm, eps=eps, singleton=singleton)
    return group_normalize(per_traj, rows.traj_group, rows.n_groups, std_norm=std_norm, eps=eps,
                           singleton=singleton, at=(per_row, rows.group))


@register_algorithm("grpo", level="trajectory")
def grpo(batch: StepBatch, *, std_norm: bool, eps: float, cross_step_stats: bool = False,
         singleton: str = "zero") -> np.ndarray:
    """GRPO outcome advantage (Shao et al. 2024, §4.1.2; GiGPO Eq.3): ``(R − mean)/(std + eps)`` over the task
    group's trajectories; ``std_norm=False`` gives Dr.GRPO's ``R − mean`` (Liu et al. 2025).
    ``cross_step_stats``: statistics over the group's step rows (verl-agent); ``singleton="reference"``: a
    lone trajectory keeps ``R/(1+eps)`` (verl's mean 0, std 1) instead of 0."""
    return _group_relative(batch, std_norm=std_norm, eps=eps, cross_step_stats=cross_step_stats,
                           singleton=singleton)


@register_algorithm("rloo", level="trajectory")
def rloo(batch: StepBatch, *, cross_step_stats: bool = False, singleton: str = "zero") -> np.ndarray:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): ``R_i − mean_{j≠i} R_j`` over the task group's
    trajectories (``cross_step_stats``: over its step rows, each row left out of its own baseline;
    ``singleton="reference"``: a lone trajectory keeps ``R``, as verl)."""
    rows = batch.rows
    per_traj, per_row = _episode_scores(batch)
    if cross_step_stats:
        return leave_one_out(per_row, rows.group, rows.n_groups, singleton=singleton)
    return leave_one_out(per_traj, rows.traj_group, rows.n_groups, singleton=singleton, at=(per_row, rows.traj))


@register_algorithm("reinforce_pp", level="trajectory")
def reinforce_pp(batch: StepBatch, *, std_norm: bool, eps: float) -> np.ndarray:
    """REINFORCE++ with a group baseline (Hu 2025, "REINFORCE++"; verl ``reinforce_plus_plus_baseline``):
    ``R − group mean``, then whitened over the whole batch's trajectories (unbiased std; ``std_norm=False``
    only centres)."""
    rows = batch.rows
    per_traj, per_row = _episode_scores(batch)
    centred = group_normalize(per_traj, rows.traj_group, rows.n_groups, std_norm=False)
    centred_rows = group_normalize(per_traj, rows.traj_group, rows.n_groups, std_norm=False,
                                   at=(per_row, rows.group))
    zeros = np.zeros(len(centred), np.int64)
    return group_normalize(centred, zeros, 1, std_norm=std_norm, eps=eps,
                           at=(centred_rows, np.zeros(rows.n, np.int64)))


def step_returns(batch: StepBatch, gamma: float) -> np.ndarray:
    """GiGPO Eq.5 per row, ``R̂_t = Σ_{k≥t} γ^{k−t} r_k``, minus the row's own invalid-action penalty (added after
    discounting, as the reference code's ``apply_invalid_action_penalty``)."""
    _check_gamma(gamma)
    ret = batch.rows.reverse_scan(batch.rewards, float(gamma))
    return ret if batch.penalties is None else ret - batch.penalties


def _two_level(batch: StepBatch, step_codes: np.ndarray, n_step: int, *, gamma: float, step_weight: float,
               std_norm: bool, eps: float, cross_step_stats: bool, singleton: str) -> np.ndarray:
    """GiGPO Eq.8 / SLEA-RL Eq.4,6: ``A = A_episode + w · A_step`` (a singleton step group: A_step = 0, as the
    reference code's step level)."""
    a_ep = _group_relative(batch, std_norm=std_norm, eps=eps, cross_step_stats=cross_step_stats,
                           singleton=singleton)
    if step_weight == 0:
        _check_gamma(gamma)
        return a_ep
    a_step = group_normalize(step_returns(batch, gamma), step_codes, n_step, std_norm=std_norm, eps=eps)
    return a_ep + float(step_weight) * a_step


@register_algorithm("gigpo", level="turn")
def gigpo(batch: StepBatch, *, gamma: float, step_weight: float, std_norm: bool, eps: float,
          cross_step_stats: bool = False, singleton: str = "zero",
          similarity_threshold: float | None = None, anchor_on: str = "observation") -> np.ndarray:
    """GiGPO (Feng et al. 2025, Eq.3-8): ``A = A^E + ω·A^S``; ``A^S`` normalises the discounted step return
    (Eq.5) inside anchor-state groups (Eq.4/6: identical ``anchors`` within a task group, Eq.7).

    ``std_norm`` is F_norm for both levels (the reference's ``mean_std_norm``; ``False`` = ``mean_norm``).
    ``cross_step_stats=True``: episode statistics over the group's step rows, as the reference code's default.
    ``singleton="reference"``: a one-member episode group keeps ``R/(1+eps)`` (reference code) instead of 0.
    ``similarity_threshold``: group anchors greedily by difflib ratio ≥ threshold (:func:`similarity_groups`).
    ``anchor_on="state_key"``: the anchor state is the env's structural key of the observation (``state_keys``;
    the observation where the family has none), so structurally equivalent states share a step group.
    """
    if anchor_on not in ("observation", "state_key"):
        raise ValueError(f"anchor_on must be 'observation' or 'state_key', not {anchor_on!r}")
    rows = batch.rows
    anchors = (batch.column("anchors", "anchors (raw observations)") if anchor_on == "observation"
               else batch.column("state_keys", "state keys (TextEnv.state_key of each anchor)"))
    if similarity_threshold is None:
        codes, n_codes = anchor_groups(rows, anchors)
    else:
        codes, n_codes = similarity_groups(rows, anchors, float(similarity_threshold))
    return _two_level(batch, codes, n_codes, gamma=gamma, step_weight=step_weight, std_norm=std_norm, eps=eps,
                      cross_step_stats=cross_step_stats, singleton=singleton)


@register_algorithm("slea", level="turn", needs=("clusters",), defaults={"experience.mode": "step"})
def slea(batch: StepBatch, *, gamma: float, step_weight: float, std_norm: bool, eps: float,
         cross_step_stats: bool = False, singleton: str = "zero") -> np.ndarray:
    """SLEA-RL (Wang & Jiang 2026, Eq.4-6): GiGPO's two-level advantage with step groups S(c) = the rows of a
    task group whose observation falls in cluster ``c`` (``clusters``; ``-1`` = a singleton group). Implies
    per-step retrieval (``experience.mode: step``) unless the config says otherwise (``off``: the library-off
    ablation, clusters only)."""
    codes, n_codes = cluster_groups(batch.rows, batch.column("clusters", "observation-cluster ids"))
    return _two_level(batch, codes, n_codes, gamma=gamma, step_weight=step_weight, std_norm=std_norm, eps=eps,
                      cross_step_stats=cross_step_stats, singleton=singleton)


# --------------------------------------------------------------------------------------------------------- #
# Entry point over plain columns                                                                            #
# --------------------------------------------------------------------------------------------------------- #

_COMMON = ("gamma", "step_weight", "std_norm", "eps")


def compute_advantages(
    name: str,
    group_ids: Any,
    traj_ids: Any,
    steps: Any,
    rewards: Any,
    anchors: Sequence[Any] | np.ndarray | None = None,
    clusters: Sequence[int] | np.ndarray | None = None,
    *,
    state_keys: Sequence[str] | np.ndarray | None = None,
    penalties: Sequence[float] | np.ndarray | None = None,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    std_norm: bool = True,
    eps: float = 1e-6,
    **options: Any,
) -> np.ndarray:
    """One advantage per step row (float64, input row order) from the algorithm registered as ``name``.

    ``group_ids`` names the task group, ``traj_ids`` the trajectory (unique within its group), ``steps`` the
    turn index, ``rewards`` the env reward of each turn; ``penalties`` each turn's invalid-action penalty, taken
    off that row's score after discounting (:func:`step_returns`; fold them into ``rewards`` instead for the
    propagated convention); ``anchors`` (raw observations) are needed by
    ``gigpo``, ``state_keys`` (the anchors' structural keys) by ``gigpo`` with ``anchor_on="state_key"``,
    ``clusters`` (observation-cluster ids, -1 = none) by ``slea``; ``values`` (an option: one
    critic value per row) by ``turn_ppo``. The common settings go to the estimators that take them; other
    ``options`` must be the estimator's own settings (``gigpo``: ``cross_step_stats``, ``singleton``,
    ``similarity_threshold``). Unknown ``name`` → ``KeyError`` listing the known ones; unknown option →
    ``TypeError``. Token-level algorithms (``ppo``) have no per-row form: use :func:`estimate`.
    """
    spec = get_algorithm(name)
    if spec.level == "token":
        raise ValueError(f"algorithm {spec.name!r} is token-level: it has one advantage per response token, "
                         f"not per step row; call slea.algorithms.batch.estimate with a StepBatch")
    values = options.pop("values", None)
    unknown = sorted(set(options) - set(spec.settings))
    if unknown:
        own = [p for p in spec.settings if p not in _COMMON] or ["none"]
        raise TypeError(f"algorithm {spec.name!r} takes no option {', '.join(unknown)}; its options: {', '.join(own)}")
    batch = StepBatch(group_ids, traj_ids, steps, rewards, anchors=_optional(anchors, object),
                      state_keys=_optional(state_keys, object),
                      clusters=_optional(clusters, np.int64), penalties=_optional(penalties, np.float64),
                      values=None if values is None else [np.atleast_1d(np.asarray(v, np.float64)) for v in values])
    settings = {"gamma": gamma, "step_weight": step_weight, "std_norm": std_norm, "eps": eps, **options}
    return estimate(spec, batch, settings).rows


def _optional(col: Any, dtype: DTypeLike) -> np.ndarray | None:
    return None if col is None else np.asarray(col, dtype=dtype)
