"""Step rows, indexed: dense group/trajectory codes in (trajectory, step) order, and the step groups the
two-level estimators (GiGPO, SLEA-RL) take statistics over (slea/algorithms/advantages.py uses both).

Rows may come in any order; :func:`index_rows` factorises them once (integer ids through a lookup table or one
sort; other hashables through a C-level dict pass) and sorts them once by (trajectory, step).
"""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RowIndex", "anchor_groups", "cluster_groups", "index_rows", "similarity_groups"]


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
    objects (strings) through one C-level dict pass (:func:`_dense_objects`), which is linear,
    unlike ``np.unique`` (a sort) on an object array.
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


def _dense_objects(items: list[Any]) -> tuple[np.ndarray, int]:
    """Dense codes in first-appearance order for a list of hashable objects.

    One C-level hash pass (``map(dict.setdefault, items, count())`` gives each item the row index of its first
    appearance), then a lookup table makes those dense. About 80 ns per string whose hash Python has already
    cached; a fresh string object pays its one-off hash (linear in its length) the first time.
    """
    n = len(items)
    if n == 0:
        return np.zeros(0, np.int64), 0
    table: dict[Any, int] = {}
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
        y: np.ndarray = np.asarray(x, dtype=np.float64)[self.order]  # a copy, in (trajectory, step) order
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
    protos: list[difflib.SequenceMatcher[str]] = []
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


def as_rewards(rewards: Any, n: int) -> np.ndarray:
    """``rewards`` as one finite float64 per row, or a ``ValueError`` saying what is wrong."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.shape != (n,):
        raise ValueError(f"rewards must have shape ({n},), got {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards contain NaN or inf")
    return r
