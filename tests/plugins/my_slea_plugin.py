"""A user's own module outside slea: one algorithm, one policy loss, one environment and one experience
extractor, registered the way a researcher would write them (tests/test_plugins.py runs them from a config)."""

from __future__ import annotations

import numpy as np

from slea.algorithms import register_algorithm, register_policy_loss
from slea.envs import TextEnv, register
from slea.experience.extraction import Candidate, register_extractor
from slea.types import Instructions

CALLS = {"estimator": 0, "loss": 0, "extract": 0, "advantages": set()}


@register_algorithm("test_plugin_sign", level="trajectory")
def sign_advantage(batch, *, eps: float, scale: float = 1.0) -> np.ndarray:
    """The sign of (R − group mean), times ``scale``: a toy estimator with one option of its own."""
    CALLS["estimator"] += 1
    rows = batch.rows
    ret = np.bincount(rows.traj, weights=batch.rewards, minlength=rows.n_traj)
    mean = np.bincount(rows.traj_group, weights=ret) / np.bincount(rows.traj_group)
    centred = ret - mean[rows.traj_group]
    return (scale * np.sign(np.where(np.abs(centred) > eps, centred, 0.0)))[rows.traj]


@register_algorithm("test_plugin_team", level="trajectory", needs=("team",))
def team_advantage(batch) -> np.ndarray:
    """An algorithm for agent teams: `slea train` runs it with the team trainer, because it declares that it needs
    a team. Copy 0 of each task scores +1, copy 1 −1 (a random tiny model never wins, so the updates need a signal
    that does not come from the env)."""
    return np.where(batch.traj_ids % 2 == 0, 1.0, -1.0)


@register_algorithm("test_plugin_team_critic", level="turn", needs=("team", "critic"))
def team_critic_advantage(batch) -> np.ndarray:
    """Needs a team and a learned critic: no trainer of `slea train` provides both, so it is refused."""
    return np.zeros(batch.n)


@register_policy_loss("test_plugin_pg")
def plain_pg(logprobs, old_logprobs, advantages, mask, *, loss_agg_mode: str = "token-mean"):
    """Vanilla policy gradient, −A·log π, token mean (no ratio, no clip)."""
    CALLS["loss"] += 1
    m = mask.to(logprobs.dtype)
    CALLS["advantages"].update(round(float(a), 6) for a in advantages[mask.bool()])
    loss = -(advantages.to(logprobs.dtype) * logprobs * m).sum() / m.sum().clamp(min=1.0)
    return loss, {"clip_frac": 0.0}


class EchoEnv(TextEnv):
    """Free text: the agent speaks three times; each answer earns its length in characters / 20 (at most 1)."""

    task_type = "echo"

    def __init__(self, split: str = "train"):  # held-out evaluation builds envs with split="heldout"
        super().__init__()
        self.split = split

    instructions = Instructions("Say something long.", (("Observation: an empty hall.\nYour words:", "hello there"),),
                                answer_cue="Your words:")

    def _reset(self, seed, options):
        self._turn, self._goal, self._admissible = 0, "speak at length", None  # None: free-text actions
        return "An empty hall echoes.", {}

    def _step(self, action):
        self._turn += 1
        done = self._turn >= 3
        return f"The hall echoes: {action[:30]}", min(len(action), 20) / 20, done, False, {"won": done}


register("test-plugin/Echo-v0", f"{__name__}:EchoEnv", family="test-plugin",
         description="a free-text env defined in a user's module")


class OneLesson:
    def extract(self, pos, neg):
        CALLS["extract"] += 1
        return [Candidate(f"Speak at length, as the hall rewards (lesson {t.traj_id}).", "pos", "principle",
                          t.episode_return, t.task_type) for t in pos]


@register_extractor("test_plugin_lessons")
def one_lesson(generate_text=None) -> OneLesson:
    return OneLesson()


__all__ = ["CALLS", "EchoEnv", "OneLesson", "one_lesson", "plain_pg", "sign_advantage", "team_advantage",
           "team_critic_advantage"]
