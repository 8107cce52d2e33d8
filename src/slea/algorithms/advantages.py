"""Advantage estimators over flat step rows: GRPO, Dr.GRPO, RLOO, REINFORCE++, GiGPO and SLEA-RL.

Every estimator is a pure function of the step-row columns and returns one float64 per row; the trainer
broadcasts it to that row's response tokens. Entry point::

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

import difflib
import inspect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slea.algorithms.registry import get_advantage, register_advantage

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
]


# --------------------------------------------------------------------------------------------------------- #
# Factorisation and the (trajectory, step) layout                                                           #
# --------------------------------------------------------------------------------------------------------- #


def _hashable(x: Any) -> Any:
    """A hashable stand-in for an unhashable anchor (ndarray, list, dict), as GiGPO's ``to_hashable``."""
    if isinstance(x, np.ndarray):
        return ("__ndarray__", x.shape, tuple(x.ravel().tolist()))
    if isinstance(x, list | tuple):
        return tuple(_hashable(e) for e in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    return x


def _dense(values: Any) -> tuple[np.ndarray, int]:
    """Dense integer codes ``0..m-1`` (equal values ↔ equal codes) and ``m``, for any 1-D column.

    Integers go through a lookup table when their span is small (no sort), else one ``np.unique``; any other
    objects (strings) through one C-level dict pass (:func:`_dense_objects`), which is linear and 5x faster
    than ``np.unique`` on an object array.
    """
    if isinstance(values, np.ndarray):
        arr = values
    else:
        seq = values if isinstance(values, list | tuple) else list(values)
        numeric = len(seq) > 0 and isinstance(seq[0], int | float | np.integer | np.floating)
        arr = np.asarray(seq) if numeric else np.empty(0)
        if not numeric or arr.ndim != 1 or arr.dtype.kind not in "iubf":
            return _dense_objects(list(seq))
    if arr.ndim != 1:  # a column of vectors: group on the whole row
        return _dense_objects([_hashable(r) for r in arr])
    n = arr.shape[0]
    if n == 0:
        return np.zeros(0, np.int64), 0
    if arr.dtype.kind in "iub":
        x = arr.astype(np.int64, copy=False)
        lo = int(x.min())
        span = int(x.max()) - lo + 1
        if span <= 4 * n + 1024:
            shifted = x - lo
            present = np.zeros(span, np.int64)
            present[shifted] = 1
            remap = np.cumsum(present) - 1
            return remap[shifted], int(remap[-1]) + 1
        uniq, inv = np.unique(x, return_inverse=True)
        return inv.reshape(-1).astype(np.int64, copy=False), len(uniq)
    if arr.dtype.kind == "f":
        uniq, inv = np.unique(arr, return_inverse=True)
        return inv.reshape(-1).astype(np.int64, copy=False), len(uniq)
    return _dense_objects(arr.tolist())


def _dense_objects(items: list) -> tuple[np.ndarray, int]:
    """Dense codes in first-appearance order for a list of hashable objects.

    One C-level hash pass (``map(dict.setdefault, items, count())`` gives each item the row index of its first
    appearance), then a lookup table makes those dense. About 80 ns per string whose hash Python has already
    cached; a fresh string object pays its one-off hash (linear in its length) the first time.
    """
    n = len(items)
    if n == 0:
        return np.zeros(0, np.int64), 0
    table: dict = {}
    try:
        first = np.fromiter(map(table.setdefault, items, itertools.count()), dtype=np.int64, count=n)
    except TypeError:  # unhashable anchors (lists, dicts, arrays)
        table = {}
        items = [_hashable(v) for v in items]
        first = np.fromiter(map(table.setdefault, items, itertools.count()), dtype=np.int64, count=n)
    present = np.zeros(n, np.int64)
    present[first] = 1
    remap = np.cumsum(present) - 1
    return remap[first], len(table)


def _pair_codes(a: np.ndarray, b: np.ndarray, nb: int) -> tuple[np.ndarray, int]:
    """Dense codes of the pairs ``(a_i, b_i)`` (both already dense codes; ``b < nb``)."""
    return _dense(a * np.int64(max(nb, 1)) + b)


@dataclass(frozen=True, eq=False)
class RowIndex:
    """The step rows factorised once: dense group / trajectory codes and the (trajectory, step) order.

    ``order`` lists row indices sorted by (trajectory, step); ``starts[j]`` / ``lengths[j]`` locate trajectory
    ``j`` inside ``order``; ``by_length`` lists trajectory codes longest first and ``n_at_least[L]`` counts the
    trajectories with at least ``L`` rows, which is what the reverse scans iterate over.
    """

    n: int
    group: np.ndarray
    n_groups: int
    traj: np.ndarray
    n_traj: int
    traj_group: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    by_length: np.ndarray
    n_at_least: np.ndarray

    @property
    def max_len(self) -> int:
        return len(self.n_at_least) - 1

    def reverse_scan(self, x: np.ndarray, coef: float) -> np.ndarray:
        """``y_t = x_t + coef · y_{t+1}`` along each trajectory (``y = x`` at its last row), per row.

        A segmented scan vectorised over trajectories: step ``k`` (from the longest trajectory's last turn
        down to 0) updates position ``k`` of every trajectory longer than ``k + 1`` at once, so the cost is
        ``O(n)`` element work in ``max T`` numpy calls, and no per-row Python loop.
        """
        y = np.asarray(x, dtype=np.float64)[self.order]  # a copy, in (trajectory, step) order
        if coef != 0.0 and self.n:
            starts = self.starts[self.by_length]
            for k in range(self.max_len - 2, -1, -1):
                idx = starts[: self.n_at_least[k + 2]] + k
                y[idx] += coef * y[idx + 1]
        out = np.empty_like(y)
        out[self.order] = y
        return out

    def next_in_traj(self, x: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """Per row, the value of ``x`` at the same trajectory's next turn (``fill`` at its last turn)."""
        xs = np.asarray(x, dtype=np.float64)[self.order]
        nxt = np.full(self.n, fill, dtype=np.float64)
        if self.n > 1:
            nxt[:-1] = xs[1:]
            nxt[self.starts + self.lengths - 1] = fill
        out = np.empty_like(nxt)
        out[self.order] = nxt
        return out


def index_rows(group_ids: Any, traj_ids: Any, steps: Any | None = None) -> RowIndex:
    """Factorise the key columns of a step-row table (see :class:`RowIndex`).

    A trajectory is a ``(group_id, traj_id)`` pair, so trajectory ids may restart in every group. ``steps``
    orders the rows of a trajectory (``None``: the input order). Raises ``ValueError`` on columns of different
    lengths or on a repeated ``(trajectory, step)``.
    """
    g_codes, n_groups = _dense(group_ids)
    t_codes, n_t = _dense(traj_ids)
    n = len(g_codes)
    if len(t_codes) != n:
        raise ValueError(f"group_ids has {n} rows but traj_ids has {len(t_codes)}")
    if steps is None:
        s = np.arange(n, dtype=np.int64)
    else:
        s = np.asarray(steps)
        if s.shape != (n,):
            raise ValueError(f"steps must have shape ({n},), got {s.shape}")
        if s.dtype.kind not in "iub":
            if s.dtype.kind == "f" and np.all(np.isfinite(s)) and np.all(s == np.round(s)):
                s = s.astype(np.int64)
            else:
                raise ValueError("steps must be integers (the turn index of each row)")
        s = s.astype(np.int64, copy=False)
    if n == 0:
        e = np.zeros(0, np.int64)
        return RowIndex(0, e, 0, e, 0, e, e, e, e, e, np.zeros(1, np.int64))
    pair = g_codes * np.int64(n_t) + t_codes  # < n_groups * n_t <= n²
    s_lo = int(s.min())
    s_span = int(s.max()) - s_lo + 1
    if n_groups * n_t * s_span < 2**62:
        key = pair * np.int64(s_span) + (s - s_lo)
        order = np.argsort(key)
        skey = key[order]
        dup = skey[1:] == skey[:-1]
        spair = skey // np.int64(s_span)
    else:  # astronomically sparse step numbers: fall back to a 2-key lexsort
        order = np.lexsort((s, pair))
        spair = pair[order]
        dup = (spair[1:] == spair[:-1]) & (s[order][1:] == s[order][:-1])
    if dup.any():
        i = order[1:][dup][0]
        raise ValueError(
            f"duplicate (group, trajectory, step) = ({np.asarray(group_ids)[i]!r}, "
            f"{np.asarray(traj_ids)[i]!r}, {s[i]}): each trajectory may have one row per step"
        )
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(spair[1:], spair[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    lengths = np.diff(np.append(starts, n))
    traj = np.empty(n, np.int64)
    traj[order] = np.cumsum(new) - 1
    n_traj = len(starts)
    by_length = np.argsort(-lengths, kind="stable")
    n_at_least = np.cumsum(np.bincount(lengths)[::-1])[::-1]  # n_at_least[L] = #trajectories with ≥ L rows
    return RowIndex(
        n=n,
        group=g_codes,
        n_groups=n_groups,
        traj=traj,
        n_traj=n_traj,
        traj_group=g_codes[order[starts]],
        order=order,
        starts=starts,
        lengths=lengths,
        by_length=by_length,
        n_at_least=n_at_least,
    )


# --------------------------------------------------------------------------------------------------------- #
# The equations: small pure functions                                                                       #
# --------------------------------------------------------------------------------------------------------- #


def _shifted(values: np.ndarray, codes: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, count, sum_x)`` with ``x = values − (some member of the value's group)``.

    Shifting by a member makes every statistic of an all-equal group exactly 0 (no ``mean`` rounding residue)
    and keeps the variance numerically stable for large offsets.
    """
    ref = np.empty(m, dtype=np.float64)
    ref[codes] = values
    x = values - ref[codes]
    return x, np.bincount(codes, minlength=m), np.bincount(codes, weights=x, minlength=m)


def group_normalize(
    values: np.ndarray,
    codes: np.ndarray,
    n_codes: int | None = None,
    *,
    std_norm: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """Group-relative advantage ``(v − mean_g) / (std_g + eps)``, or ``v − mean_g`` when ``std_norm`` is false.

    GRPO (Shao et al. 2024, DeepSeekMath §4.1.2 outcome supervision; objective Eq. 3); GiGPO Eq.3 (episode level, over the N
    trajectories of a task group) and Eq.7 (step level, over an anchor-state group), where ``F_norm ∈ {std, 1}``
    is ``std_norm``; SLEA-RL Eq.5 (over an observation cluster); Dr.GRPO (Liu et al. 2025) drops the std.
    ``std`` is the unbiased sample std (ddof=1, as ``torch.std``). A group of one member gets 0; a group whose
    values are all equal gets exactly 0.
    """
    v = np.asarray(values, dtype=np.float64)
    c = np.asarray(codes, dtype=np.int64)
    m = int(c.max()) + 1 if n_codes is None and len(c) else int(n_codes or 0)
    if len(v) == 0:
        return np.zeros(0, np.float64)
    x, cnt, sx = _shifted(v, c, m)
    dev = x - (sx / np.maximum(cnt, 1))[c]
    if std_norm:
        var = np.bincount(c, weights=dev * dev, minlength=m) / np.maximum(cnt - 1, 1)
        std = np.sqrt(var)[c]
        with np.errstate(divide="ignore", invalid="ignore"):
            adv = np.where(std > 0, dev / (std + eps), 0.0)
    else:
        adv = dev
    adv[cnt[c] < 2] = 0.0
    return adv


def leave_one_out(values: np.ndarray, codes: np.ndarray, n_codes: int | None = None) -> np.ndarray:
    """RLOO baseline: ``A_i = R_i − mean_{j≠i} R_j`` over the members of ``R_i``'s group.

    Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free!"; Ahmadian et al. 2024 (RLOO for
    LLMs). Equals ``G/(G−1)·(R_i − mean)`` (GiGPO App. C). A group of one member gets 0.
    """
    v = np.asarray(values, dtype=np.float64)
    c = np.asarray(codes, dtype=np.int64)
    m = int(c.max()) + 1 if n_codes is None and len(c) else int(n_codes or 0)
    if len(v) == 0:
        return np.zeros(0, np.float64)
    x, cnt, sx = _shifted(v, c, m)
    k = cnt[c]
    with np.errstate(divide="ignore", invalid="ignore"):
        adv = np.where(k > 1, x - (sx[c] - x) / np.maximum(k - 1, 1), 0.0)
    return adv


def batch_whiten(values: np.ndarray, *, std_norm: bool = True, eps: float = 1e-6) -> np.ndarray:
    """``(v − mean(v)) / (std(v) + eps)`` over the whole batch (REINFORCE++, Hu 2025: global advantage
    normalisation; verl ``masked_whiten``). Unbiased std; fewer than two values, or all equal, give 0."""
    v = np.asarray(values, dtype=np.float64)
    return group_normalize(v, np.zeros(len(v), np.int64), 1, std_norm=std_norm, eps=eps)


def _episode_returns(rows: RowIndex, rewards: np.ndarray) -> np.ndarray:
    """Per trajectory code: ``R(τ) = Σ_t r_t``."""
    return np.bincount(rows.traj, weights=rewards, minlength=rows.n_traj)


def _as_rewards(rewards: Any, n: int) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if r.shape != (n,):
        raise ValueError(f"rewards must have shape ({n},), got {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards contain NaN or inf")
    return r


def episode_returns(traj_ids: Any, rewards: Any, group_ids: Any | None = None) -> np.ndarray:
    """Per row, the episode return ``R(τ) = Σ_t r_t`` of the row's trajectory (GiGPO Eq.3's R(τ_i)).

    A trajectory is a ``traj_id`` (or a ``(group_id, traj_id)`` pair when ``group_ids`` is given).
    """
    t = np.asarray(traj_ids)
    rows = index_rows(np.zeros(len(t), np.int64) if group_ids is None else group_ids, t, None)
    r = _as_rewards(rewards, rows.n)
    return _episode_returns(rows, r)[rows.traj]


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
    return rows.reverse_scan(_as_rewards(rewards, rows.n), float(gamma))


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


# --------------------------------------------------------------------------------------------------------- #
# Step groups                                                                                               #
# --------------------------------------------------------------------------------------------------------- #


def anchor_groups(rows: RowIndex, anchors: Any) -> tuple[np.ndarray, int]:
    """GiGPO Eq.4/6 anchor-state groups: rows of one task group with identical anchors (dense codes, count).

    Repeated states inside one trajectory join the same group (as the reference code does).
    """
    a_codes, n_a = _dense(_as_column(anchors, rows.n, "anchors"))
    return _pair_codes(rows.group, a_codes, n_a)


def cluster_groups(rows: RowIndex, clusters: Any) -> tuple[np.ndarray, int]:
    """SLEA-RL Eq.5 step groups S(c): rows of one task group in the same observation cluster.

    Rows with cluster id ``-1`` (unclustered) each form their own singleton group.
    """
    c = np.asarray(_as_column(clusters, rows.n, "clusters"))
    if c.dtype.kind not in "iub":
        raise ValueError("clusters must be integer ids (-1 = unclustered)")
    c = c.astype(np.int64, copy=False)
    c_codes, n_c = _dense(c)
    lone = c < 0
    if lone.any():  # give each unclustered row a code of its own
        c_codes = c_codes.copy()
        c_codes[lone] = n_c + np.arange(int(lone.sum()), dtype=np.int64)
        n_c += int(lone.sum())
    return _pair_codes(rows.group, c_codes, n_c)


def similarity_groups(rows: RowIndex, anchors: Any, threshold: float) -> tuple[np.ndarray, int]:
    """GiGPO's similarity-based step groups (Search-QA variant; reference ``build_step_group`` with
    ``enable_similarity=True``): inside each task group, rows are taken in row order and each joins the first
    existing group whose *first member* has ``difflib.SequenceMatcher(None, anchor, first).ratio() ≥
    threshold``, else opens a new group. Greedy and order-dependent, exactly as the reference code.

    Faster than the reference but with the same result: identical anchors are decided once (a repeat always
    lands where its first copy did), each group keeps one matcher with its prototype as the cached second
    sequence, and the cheap upper bounds ``real_quick_ratio``/``quick_ratio`` reject most candidates before
    ``ratio``. Still ``O(distinct anchors × groups)`` difflib calls per task group: an opt-in slow path.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"similarity_threshold must be in (0, 1], got {threshold}")
    col = _as_column(anchors, rows.n, "anchors")
    a_codes, n_a = _dense(col)
    pair, n_pair = _pair_codes(rows.group, a_codes, n_a)
    if rows.n == 0:
        return pair, n_pair
    # one representative row per distinct (task group, anchor), in first-appearance row order
    first = np.full(n_pair, rows.n, dtype=np.int64)
    np.minimum.at(first, pair, np.arange(rows.n, dtype=np.int64))
    reps = first[np.lexsort((first, rows.group[first]))]
    texts = [col[i] for i in reps.tolist()]
    groups = rows.group[reps]
    label = np.empty(n_pair, dtype=np.int64)
    n_out = 0
    protos: list[difflib.SequenceMatcher] = []
    prev_group = -1
    for rep, text, grp in zip(reps.tolist(), texts, groups.tolist(), strict=True):
        if not isinstance(text, str):
            raise TypeError("similarity grouping supports text anchors only")
        if grp != prev_group:
            protos, base, prev_group = [], n_out, grp
        for j, sm in enumerate(protos):
            sm.set_seq1(text)
            if (
                sm.real_quick_ratio() >= threshold
                and sm.quick_ratio() >= threshold
                and sm.ratio() >= threshold
            ):
                label[pair[rep]] = base + j
                break
        else:
            protos.append(difflib.SequenceMatcher(None, "", text))
            label[pair[rep]] = n_out
            n_out += 1
    return label[pair], n_out


def _as_column(values: Any, n: int, what: str) -> Any:
    if values is None:
        raise ValueError(f"this estimator needs {what} (one per step row)")
    if len(values) != n:
        raise ValueError(f"{what} has {len(values)} rows, expected {n}")
    return values


# --------------------------------------------------------------------------------------------------------- #
# Registered estimators                                                                                     #
# --------------------------------------------------------------------------------------------------------- #


@register_advantage("grpo")
def grpo(
    rows: RowIndex, rewards: np.ndarray, anchors=None, clusters=None, *, gamma, step_weight, std_norm, eps
):
    """GRPO outcome advantage (Shao et al. 2024, §4.1.2; GiGPO Eq.3): ``(R − mean)/(std + eps)`` over the task
    group's trajectories; ``std_norm=False`` gives Dr.GRPO's ``R − mean`` (Liu et al. 2025)."""
    a = group_normalize(
        _episode_returns(rows, rewards), rows.traj_group, rows.n_groups, std_norm=std_norm, eps=eps
    )
    return a[rows.traj]


@register_advantage("rloo")
def rloo(
    rows: RowIndex, rewards: np.ndarray, anchors=None, clusters=None, *, gamma, step_weight, std_norm, eps
):
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): ``R_i − mean_{j≠i} R_j`` over the task group's trajectories."""
    return leave_one_out(_episode_returns(rows, rewards), rows.traj_group, rows.n_groups)[rows.traj]


@register_advantage("reinforce_pp")
def reinforce_pp(
    rows: RowIndex, rewards: np.ndarray, anchors=None, clusters=None, *, gamma, step_weight, std_norm, eps
):
    """REINFORCE++ with a group baseline (Hu 2025, "REINFORCE++"; verl ``reinforce_plus_plus_baseline``):
    ``R − group mean``, then whitened over the whole batch's trajectories (unbiased std; ``std_norm=False``
    only centres)."""
    centred = group_normalize(_episode_returns(rows, rewards), rows.traj_group, rows.n_groups, std_norm=False)
    return batch_whiten(centred, std_norm=std_norm, eps=eps)[rows.traj]


def _episode_level(
    rows: RowIndex, rewards: np.ndarray, *, std_norm: bool, eps: float, cross_step_stats: bool
):
    """GiGPO Eq.3 per row; ``cross_step_stats`` reproduces the reference code's statistics over step rows."""
    ret = _episode_returns(rows, rewards)
    if cross_step_stats:  # reference episode_norm_reward(compute_mean_std_cross_steps=True)
        return group_normalize(ret[rows.traj], rows.group, rows.n_groups, std_norm=std_norm, eps=eps)
    return group_normalize(ret, rows.traj_group, rows.n_groups, std_norm=std_norm, eps=eps)[rows.traj]


def _two_level(rows, rewards, step_codes, n_step, *, gamma, step_weight, std_norm, eps, cross_step_stats):
    """GiGPO Eq.8 / SLEA-RL Eq.4,6: ``A = A_episode + w · A_step``."""
    _check_gamma(gamma)
    a_ep = _episode_level(rows, rewards, std_norm=std_norm, eps=eps, cross_step_stats=cross_step_stats)
    if step_weight == 0:
        return a_ep
    step_ret = rows.reverse_scan(rewards, float(gamma))
    a_step = group_normalize(step_ret, step_codes, n_step, std_norm=std_norm, eps=eps)
    return a_ep + float(step_weight) * a_step


@register_advantage("gigpo")
def gigpo(
    rows: RowIndex,
    rewards: np.ndarray,
    anchors=None,
    clusters=None,
    *,
    gamma,
    step_weight,
    std_norm,
    eps,
    cross_step_stats: bool = False,
    similarity_threshold: float | None = None,
):
    """GiGPO (Feng et al. 2025, Eq.3-8): ``A = A^E + ω·A^S``; ``A^S`` normalises the discounted step return
    (Eq.5) inside anchor-state groups (Eq.4/6: identical ``anchors`` within a task group, Eq.7).

    ``std_norm`` is F_norm for both levels (the reference's ``mean_std_norm``; ``False`` = ``mean_norm``).
    ``cross_step_stats=True``: episode statistics over the group's step rows, as the reference code's default.
    ``similarity_threshold``: group anchors greedily by difflib ratio ≥ threshold (:func:`similarity_groups`).
    """
    if similarity_threshold is None:
        codes, n_codes = anchor_groups(rows, anchors)
    else:
        codes, n_codes = similarity_groups(rows, anchors, float(similarity_threshold))
    return _two_level(
        rows,
        rewards,
        codes,
        n_codes,
        gamma=gamma,
        step_weight=step_weight,
        std_norm=std_norm,
        eps=eps,
        cross_step_stats=cross_step_stats,
    )


@register_advantage("slea")
def slea(
    rows: RowIndex,
    rewards: np.ndarray,
    anchors=None,
    clusters=None,
    *,
    gamma,
    step_weight,
    std_norm,
    eps,
    cross_step_stats: bool = False,
):
    """SLEA-RL (Wang & Jiang 2026, Eq.4-6): GiGPO's two-level advantage with step groups S(c) = the rows of a
    task group whose observation falls in cluster ``c`` (``clusters``; ``-1`` = a singleton group)."""
    codes, n_codes = cluster_groups(rows, clusters)
    return _two_level(
        rows,
        rewards,
        codes,
        n_codes,
        gamma=gamma,
        step_weight=step_weight,
        std_norm=std_norm,
        eps=eps,
        cross_step_stats=cross_step_stats,
    )


# --------------------------------------------------------------------------------------------------------- #
# Critic-based estimators (PPO, Turn-PPO): they need the learned values; the trainer computes those         #
# (slea/trainer/critic.py). ``value_level`` tells it where the critic reads them.                           #
# --------------------------------------------------------------------------------------------------------- #


def _values(name: str, values: Any, n: int) -> np.ndarray:
    if values is None:
        raise ValueError(
            f"advantage {name!r} needs a learned critic: pass values= (one per step row); the trainer "
            f"computes them with its value head (slea.trainer.critic)"
        )
    v = np.asarray(values, dtype=np.float64)
    if v.shape != (n,):
        raise ValueError(f"values must have shape ({n},), got {v.shape}")
    return v


@register_advantage("turn_ppo")
def turn_ppo(
    rows: RowIndex,
    rewards: np.ndarray,
    anchors=None,
    clusters=None,
    *,
    gamma,
    step_weight,
    std_norm,
    eps,
    values=None,
    lam: float = 0.9,
):
    """Turn-PPO (Li et al. 2025, arXiv 2512.17008): turn-level GAE (Schulman et al. 2016, Eq. 16) with one
    state per turn: ``δ_t = r_t + γ V_{t+1} − V_t`` (``V`` = 0 after the last turn), ``Â_t = δ_t + γλ Â_{t+1}``.
    ``values``: the critic's value at each row's turn boundary (the last prompt token). The trainer calls it
    with ``gamma = algorithm.turn_gamma``, ``lam = algorithm.turn_lambda``."""
    _check_gamma(gamma)
    if not 0.0 <= float(lam) <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    v = _values("turn_ppo", values, rows.n)
    delta = rewards + float(gamma) * rows.next_in_traj(v, 0.0) - v
    return rows.reverse_scan(delta, float(gamma) * float(lam))


turn_ppo.value_level = "turn"


@register_advantage("ppo")
def ppo(rows: RowIndex, rewards: np.ndarray, anchors=None, clusters=None, *, gamma, step_weight, std_norm, eps,
        values=None):
    """PPO with token-level GAE (Schulman et al. 2017; GAE 2016 Eq. 16; Ouyang et al. 2022 for LLMs): one
    advantage per response *token*, so there is no per-row form here; the trainer computes it from the
    critic's values at every response token (:func:`slea.trainer.critic.token_advantages`)."""
    _values("ppo", values, rows.n)
    raise ValueError(
        "advantage 'ppo' is token-level GAE: it has one advantage per response token, not per step row; use "
        "slea.trainer.critic.token_advantages (the trainer does when algorithm.name is ppo)"
    )


ppo.value_level = "token"


def value_level(name: str) -> str | None:
    """``"token"`` / ``"turn"`` when the estimator registered as ``name`` needs a learned critic (where the
    critic reads its values), else ``None``."""
    return getattr(get_advantage(name), "value_level", None)


# --------------------------------------------------------------------------------------------------------- #
# Entry point                                                                                               #
# --------------------------------------------------------------------------------------------------------- #

_COMMON = ("rows", "rewards", "anchors", "clusters", "gamma", "step_weight", "std_norm", "eps")


def compute_advantages(
    name: str,
    group_ids: Any,
    traj_ids: Any,
    steps: Any,
    rewards: Any,
    anchors: Sequence[Any] | np.ndarray | None = None,
    clusters: Sequence[int] | np.ndarray | None = None,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    std_norm: bool = True,
    eps: float = 1e-6,
    **options: Any,
) -> np.ndarray:
    """One advantage per step row (float64, input row order) from the estimator registered as ``name``.

    ``group_ids`` names the task group, ``traj_ids`` the trajectory (unique within its group), ``steps`` the
    turn index, ``rewards`` the env reward of each turn; ``anchors`` (raw observations) are needed by
    ``gigpo``, ``clusters`` (observation-cluster ids, -1 = none) by ``slea``. ``options`` are estimator
    specific (``gigpo``: ``cross_step_stats``, ``similarity_threshold``; ``slea``: ``cross_step_stats``).
    Unknown ``name`` → ``KeyError`` listing the known ones; unknown option → ``TypeError``.
    """
    fn = get_advantage(name)
    if options:
        params = inspect.signature(fn).parameters
        unknown = sorted(set(options) - set(params))
        if unknown:
            own = [p for p in params if p not in _COMMON] or ["none"]
            raise TypeError(
                f"advantage {name!r} takes no option {', '.join(unknown)}; its options: {', '.join(own)}"
            )
    rows = index_rows(group_ids, traj_ids, steps)
    r = _as_rewards(rewards, rows.n)
    out = fn(
        rows,
        r,
        anchors,
        clusters,
        gamma=gamma,
        step_weight=step_weight,
        std_norm=std_norm,
        eps=eps,
        **options,
    )
    return np.asarray(out, dtype=np.float64)
