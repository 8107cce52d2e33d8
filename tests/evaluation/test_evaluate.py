"""evaluate(): the held-out pools get the same env fault handling as training (step/reset timeouts)."""

from __future__ import annotations

import time

import slea.testing.faulty_env  # noqa: F401  (registers slea/test-Faulty-v0)
from slea.config import EvalSection, RolloutSection
from slea.evaluation.evaluate import evaluate
from slea.policy.generation import Generation
from slea.policy.prompts import PromptBuilder
from slea.rollout.collector import RolloutCollector
from slea.testing.faulty_env import FAULTY_ID


class AlwaysUp:
    """A generator that answers 'up' (a valid Sokoban move) for every prompt."""

    def generate(self, prompts, **kw):
        return [Generation([7], [-0.1], "up") for _ in prompts]


def test_a_hung_eval_env_times_out_instead_of_blocking(tiny_policy):
    _, tok = tiny_policy
    col = RolloutCollector(AlwaysUp(), PromptBuilder(tok), RolloutSection(), max_steps=3)
    kwargs = {"inner": "slea/Sokoban-v0", "hang_prob": 1.0, "hang_s": 60.0}
    t0 = time.perf_counter()
    res = evaluate(col, FAULTY_ID, kwargs, EvalSection(games=1, episodes_per_game=1, greedy=False),
                   step_timeout_s=0.3)
    assert time.perf_counter() - t0 < 60.0  # the 60 s hang never ran to its end: the timeout fired
    assert res["sampled"]["episodes"] == 1 and res["sampled"]["success"] == 0.0
