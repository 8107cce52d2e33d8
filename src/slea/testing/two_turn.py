"""A crafted two-turn env for credit-assignment tests: only the first turn's choice decides the reward.

``slea/FirstChoice-v0`` (registered when this module is imported: ``plugins: [slea.testing.two_turn]``).
Turn 1 asks for a word; any answer is a choice, *right* when its first character is a letter from ``a`` to
``m`` (:func:`is_right`). Turn 2 asks for any word and ends the episode with reward 1 after a right first
choice, else 0: what is said at turn 2 changes nothing. Free-text answers (no command list), so a tiny random
model makes real choices. Deterministic, so it opts into the base's replay snapshots (``snapshots =
"replay"``, :class:`slea.envs.base.TextEnv`).
"""

from __future__ import annotations

from typing import Any

from slea.envs.base import StepResult, TextEnv, register
from slea.types import Instructions

RIGHT = frozenset("abcdefghijklm")


def is_right(answer: str) -> bool:
    """Whether a first-turn answer is the right choice: its first character is a letter a-m."""
    text = answer.strip().lower()
    return bool(text) and text[0] in RIGHT


class FirstChoiceEnv(TextEnv):
    task_type = "first_choice"
    snapshots = "replay"  # the base's fallback: reset with the seed, replay the answers
    instructions = Instructions(system="Answer with one word.")

    def __init__(self, split: str = "train") -> None:
        super().__init__()
        self.split = split  # one task on every split
        self._turn = 0
        self._right = False

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._goal = "Say a word, then another."
        self._turn, self._right = 0, False
        return "Say a word.", {}

    def _step(self, action: str) -> StepResult:
        self._turn += 1
        if self._turn == 1:
            self._right = is_right(action)
            return "Say another word.", 0.0, False, False, {}
        if self._turn == 2:
            return "Done.", float(self._right), True, False, {"won": self._right}
        return self._reject("The episode is over.")


register("slea/FirstChoice-v0", "slea.testing.two_turn:FirstChoiceEnv", family="test",
         description="Two turns; only the first answer decides the reward (credit-assignment tests)")
