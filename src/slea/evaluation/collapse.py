"""Signs of a collapsed policy in one iteration's episodes (``collapse/*`` metrics).

A group-relative method learns only from task groups whose episodes differ: when every copy of a task plays the
same way, the group's returns are equal, every advantage in it is 0 and the update has nothing to follow — an
absorbing state. These pure functions count how close a batch is to it: the share of task groups whose returns
are all equal, and how many distinct first actions the copies of a task chose. With the policy's token entropy
(``rollout/entropy``, slea.algorithms.entropy) they show a collapse as it happens.
"""

from __future__ import annotations

from collections import defaultdict

from slea.types import Trajectory

INVALID = "<invalid>"  # the first action of an episode whose first answer was not a valid action


def _groups(trajs: list[Trajectory]) -> dict[int, list[Trajectory]]:
    out: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        out[t.group_id].append(t)
    return out


def equal_return_fraction(trajs: list[Trajectory], tol: float = 1e-9) -> float:
    """The share of task groups (of at least two episodes) whose episode returns are all equal (within ``tol``):
    the groups that give a group-relative estimator no episode-level signal. NaN when no group has two
    episodes."""
    sizes = [g for g in _groups(trajs).values() if len(g) >= 2]
    if not sizes:
        return float("nan")
    flat = sum(1 for g in sizes if max(t.episode_return for t in g) - min(t.episode_return for t in g) <= tol)
    return flat / len(sizes)


def first_action(t: Trajectory) -> str | None:
    """The episode's first action (``INVALID`` when its first answer was not valid), ``None`` without steps."""
    if not t.steps:
        return None
    s = t.steps[0]
    return s.action if s.valid and s.action else INVALID


def distinct_first_actions(trajs: list[Trajectory]) -> float:
    """The mean, over task groups, of the number of distinct first actions its episodes chose (1: every copy
    opened the same way). NaN without episodes that took a step."""
    counts = []
    for g in _groups(trajs).values():
        firsts = {a for a in map(first_action, g) if a is not None}
        if firsts:
            counts.append(len(firsts))
    return sum(counts) / len(counts) if counts else float("nan")


def collapse_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """``equal_return_frac`` and ``distinct_first_actions`` of one iteration's episodes."""
    return {"equal_return_frac": equal_return_fraction(trajs), "distinct_first_actions": distinct_first_actions(trajs)}
