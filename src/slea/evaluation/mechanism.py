"""Whether SLEA-RL's mechanism acts, measured on the steps played: pure functions over trajectories.

* ``retrieval_hit_rate`` — the share of decision steps whose prompt held retrieved lessons;
* ``retrieval_right_state`` — of those hits with a state key, the share whose lessons come from the step's own
  kind of state (an Eq.1 hit's cluster has the step's key as its first member's; an Eq.2 hit's lessons are each
  linked to another cluster with it: ``Step.info["right_state"]``, set by the collector);
* ``lesson_followed`` — of the hits whose lessons quote commands, the share whose action is one of them
  (placeholders filled: ``Step.info["lesson_actions"]``);
* ``step_group_size`` — the mean size of a step row's SLEA-RL Eq.5 step group: the rows of its task group in
  the same observation cluster (rows without a cluster are left out). Singletons, the groups that carry no step
  advantage, pull it towards 1.
"""

from __future__ import annotations

from collections import Counter

from slea.types import Trajectory

__all__ = ["mechanism_metrics"]


def _norm(action: str) -> str:
    return " ".join(str(action).lower().split())


def mechanism_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """The four figures of the module docstring over every step of ``trajs`` (a rate with nothing to count is
    0.0, so every run logs the same keys)."""
    steps = [s for t in trajs for s in t.steps]
    hits = [s for s in steps if s.experience_ids]
    judged = [s.info["right_state"] for s in hits if s.info.get("right_state") is not None]
    quoted = [s for s in hits if s.info.get("lesson_actions")]
    followed = sum(_norm(s.action) in {_norm(a) for a in s.info["lesson_actions"]} for s in quoted if s.valid)
    groups = Counter((s.group_id, s.cluster_id) for s in steps if s.cluster_id >= 0)
    clustered = [groups[(s.group_id, s.cluster_id)] for s in steps if s.cluster_id >= 0]
    return {
        "retrieval_hit_rate": len(hits) / max(len(steps), 1),
        "retrieval_right_state": sum(judged) / len(judged) if judged else 0.0,
        "lesson_followed": followed / len(quoted) if quoted else 0.0,
        "step_group_size": sum(clustered) / len(clustered) if clustered else 0.0,
    }
