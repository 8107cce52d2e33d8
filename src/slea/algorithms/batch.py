"""The estimators' typed input and output: :class:`StepBatch` in, :class:`Advantages` out.

Every registered algorithm reads a :class:`StepBatch` (the step rows of one iteration as columns, plus the
critic's values when it needs a critic) and ends in one advantage per *response token* of every row
(:meth:`Advantages.per_token`): a ``trajectory``- or ``turn``-level advantage is broadcast to its row's tokens,
a ``token``-level one is already per token. That one layout is what every policy loss consumes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from slea.algorithms.registry import AlgorithmSpec
from slea.algorithms.rows import RowIndex, as_rewards, index_rows
from slea.types import Step

__all__ = ["Advantages", "StepBatch", "estimate"]


@dataclass(eq=False)
class StepBatch:
    """One row per (trajectory, turn), as columns (rows in any order; a trajectory is ``(group_id, traj_id)``).

    ``anchors``: raw observations (GiGPO's step groups); ``state_keys``: the env's structural key of each
    anchor, the anchor itself where the family has none (GiGPO with ``anchor_on="state_key"``); ``clusters``: observation-cluster ids, -1 = none
    (SLEA-RL); ``response_lengths``: response tokens per row; ``values``: the critic's values per row — one
    (``turn`` level: at the row's turn boundary) or one per response token (``token`` level) — when the algorithm
    needs a critic; ``penalties``: the invalid-action penalty of each row, kept apart from ``rewards`` (the env's)
    so estimators can charge it to that row only, after discounting (``None``: already folded into ``rewards``).
    """

    group_ids: np.ndarray
    traj_ids: np.ndarray
    steps: np.ndarray
    rewards: np.ndarray
    anchors: np.ndarray | None = None
    clusters: np.ndarray | None = None
    response_lengths: np.ndarray | None = None
    values: list[np.ndarray] | None = None
    penalties: np.ndarray | None = None
    state_keys: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.group_ids)
        self.rewards = as_rewards(self.rewards, n)
        if self.penalties is not None:
            self.penalties = as_rewards(self.penalties, n)
        for name in ("group_ids", "traj_ids", "steps", "anchors", "clusters", "response_lengths", "values",
                     "state_keys"):
            col = getattr(self, name)
            if col is not None and len(col) != n:
                raise ValueError(f"{name} has {len(col)} rows, group_ids {n}")

    @classmethod
    def from_steps(cls, steps: list[Step], values: list[np.ndarray] | None = None,
                   penalty_at: str = "step") -> StepBatch:
        """The batch of a rollout's step rows (``values``: the critic's, in row order). ``penalty_at``: where
        invalid-action penalties go — ``"step"``: kept apart (``penalties``), charged to their own row after
        discounting (GiGPO's reference code); ``"return"``: folded into the rewards before discounting, so they
        lower every earlier step's return too."""
        if penalty_at not in ("step", "return"):
            raise ValueError(f"penalty_at must be 'step' or 'return', got {penalty_at!r}")
        pen = np.asarray([s.penalty for s in steps], dtype=np.float64)
        folded = np.asarray([s.reward for s in steps], dtype=np.float64)
        apart = penalty_at == "step"
        return cls(
            group_ids=np.asarray([s.group_id for s in steps], dtype=np.int64),
            traj_ids=np.asarray([s.traj_id for s in steps], dtype=np.int64),
            steps=np.asarray([s.step for s in steps], dtype=np.int64),
            rewards=folded + pen if apart else folded,
            penalties=pen if apart else None,
            anchors=np.asarray([s.anchor for s in steps], dtype=object),
            state_keys=np.asarray([s.state_key or s.anchor for s in steps], dtype=object),
            clusters=np.asarray([s.cluster_id for s in steps], dtype=np.int64),
            response_lengths=np.asarray([len(s.response_ids) for s in steps], dtype=np.int64),
            values=values,
        )

    @property
    def n(self) -> int:
        return len(self.rewards)

    @property
    def folded_rewards(self) -> np.ndarray:
        """Rewards with the penalties folded in (``r_t − p_t``): what a critic's returns are built from."""
        return self.rewards if self.penalties is None else self.rewards - self.penalties

    @cached_property
    def rows(self) -> RowIndex:
        """The rows factorised once (group / trajectory codes, (trajectory, step) order)."""
        return index_rows(self.group_ids, self.traj_ids, self.steps)

    def column(self, name: str, need: str) -> Any:
        """Column ``name``, or a ``ValueError`` saying the estimator needs it."""
        col = getattr(self, name)
        if col is None:
            raise ValueError(f"this estimator needs {need} (one per step row): StepBatch.{name} is empty")
        return col


@dataclass
class Advantages:
    """An estimator's output. ``rows``: one advantage per row (for ``token`` level, the mean of the row's
    token advantages: what metrics show); ``tokens``: per row, one advantage per response token (``token``
    level only); ``returns``: the critic's regression targets, in the layout of ``StepBatch.values``; ``train``:
    the rows the update trains on (``None``: every row; RTPO trains each sibling's forked turn alone)."""

    rows: np.ndarray
    tokens: list[np.ndarray] | None = None
    returns: list[np.ndarray] | None = None
    train: np.ndarray | None = None

    @property
    def trained_rows(self) -> np.ndarray:
        """The advantages of the rows the update trains on (all rows without a ``train`` mask)."""
        return self.rows if self.train is None else self.rows[self.train]

    def per_token(self, lengths: Any) -> list[np.ndarray]:
        """One array per row with one advantage per response token: the token advantages, or the row's
        advantage broadcast to its ``lengths[i]`` tokens."""
        if self.tokens is not None:
            return [np.asarray(t, dtype=np.float64) for t in self.tokens]
        return [np.full(int(k), float(a)) for a, k in zip(self.rows, lengths)]


def estimate(spec: AlgorithmSpec, batch: StepBatch, settings: Mapping[str, Any]) -> Advantages:
    """Run ``spec``'s estimator on ``batch`` with the settings it takes (``settings`` may hold more: only the
    estimator's own keyword parameters are passed; a required one that is missing is a ``TypeError``)."""
    missing = [k for k in spec.required if k not in settings]
    if missing:
        raise TypeError(f"algorithm {spec.name!r} needs the setting(s) {', '.join(missing)}")
    out = spec.estimator(batch, **{k: settings[k] for k in spec.settings if k in settings})
    if isinstance(out, Advantages):
        adv = out
    else:
        adv = Advantages(np.asarray(out, dtype=np.float64))
    if adv.rows.shape != (batch.n,):
        raise ValueError(f"algorithm {spec.name!r} returned {adv.rows.shape} advantages for {batch.n} rows")
    if adv.train is not None and np.shape(adv.train) != (batch.n,):
        raise ValueError(f"algorithm {spec.name!r} returned a train mask of {np.shape(adv.train)} for {batch.n} rows")
    if spec.level == "token" and adv.tokens is None:
        raise ValueError(f"algorithm {spec.name!r} is token-level but returned no per-token advantages")
    return adv
