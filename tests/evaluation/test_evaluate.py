"""evaluate(): the held-out pools get the same env fault handling as training (step/reset timeouts)."""

from __future__ import annotations

import slea.testing.faulty_env  # noqa: F401  (registers slea/test-Faulty-v0)
from slea.config import EnvSection, EvalSection, RolloutSection
from slea.evaluation.evaluate import evaluate
from slea.policy.generation import Generation
from slea.policy.prompt_builder import PromptBuilder
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
    res = evaluate(col, EnvSection(id=FAULTY_ID, step_timeout_s=0.3), kwargs,
                   EvalSection(games=1, episodes_per_game=1, greedy=False), keep_trajectories=True)
    (traj,) = res["trajectories"]["sampled"]
    # the first step hung: the pool's step timeout ended the episode there as a fault (without it, the step
    # would have answered after 60 s with no fault and the episode gone on to max_steps)
    assert [s.info.get("fault") for s in traj.steps] == ["timeout"]
    assert traj.truncated and not traj.won and traj.steps[0].reward == 0.0
    assert res["sampled"]["episodes"] == 1 and res["sampled"]["success"] == 0.0


def test_two_evaluations_of_the_same_weights_are_equal_and_paired(tiny_policy):
    """Sampling is keyed per (evaluation, env seed, episode, turn): what ran before in the process, including
    other draws from torch's global RNG, does not change an evaluation (the issue's 0.344 vs 0.375)."""
    import torch

    from slea.policy.generation import HFGenerator

    model, tok = tiny_policy
    col = RolloutCollector(HFGenerator(model, tok, dtype="float32"), PromptBuilder(tok),
                           RolloutSection(max_new_tokens=4), max_steps=3)
    cfg = EvalSection(games=2, episodes_per_game=3, greedy=False, temperature=1.0)

    def run(seed):
        torch.manual_seed(seed)
        torch.rand(10_000)  # whatever else ran in the process between the two evaluations
        res = evaluate(col, EnvSection(id="slea/Sokoban-v0"), {"split": "heldout"}, cfg, keep_trajectories=True)
        return res, [[s.response_text for s in t.steps] for t in res["trajectories"]["sampled"]]

    a, texts_a = run(0)
    b, texts_b = run(1)
    assert texts_a == texts_b and a["sampled"] == b["sampled"] and a["per_game_wins"] == b["per_game_wins"]
    # the episodes themselves differ from one another (sampled, not one repeated stream)
    assert len({tuple(t) for t in texts_a}) > 1
