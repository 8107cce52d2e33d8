"""A generator that answers scripted text, for tests that play a known sequence of answers through the collector."""

from __future__ import annotations

from typing import Any

from slea.alignment.data import action_ids
from slea.policy.generation import Generation


class ExpertGenerator:
    """Answers ``walkthroughs[env seed][turn]`` at each turn (the rollout key carries (salt, env seed, copy,
    turn)), with the ids a model answering that text generates (:func:`slea.alignment.data.action_ids`: its
    tokens, then EOS) and log-probs 0."""

    def __init__(self, tokenizer, walkthroughs: dict[int, list[str]]) -> None:
        self.tok = tokenizer
        self.walks = walkthroughs

    def generate(self, prompts: list[list[int]], *, rng_keys, **kw: Any) -> list[Generation]:
        out = []
        for _, seed, _, turn in rng_keys:
            action = self.walks[seed][turn]
            ids = action_ids(self.tok, action)
            out.append(Generation(ids, [0.0] * len(ids), action))
        return out
