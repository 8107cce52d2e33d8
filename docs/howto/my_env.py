"""A complete environment of your own: the three-doors task of docs/howto.md.

The goal names the door the key is behind; the agent opens one door from the list of valid commands and wins
when it picks the named one. Held-out games (``split="heldout"``) use colours training never shows.

Run it from the repository root (``plugins: [docs.howto.my_env]`` imports this file by its dotted path, and the
``slea`` command searches the working directory for plugin modules):

    slea train docs/howto/my_env.yaml
"""

from __future__ import annotations

from slea.envs import TextEnv, register
from slea.types import Instructions

COLOURS = {"train": ("red", "blue", "green", "white"), "heldout": ("orange", "purple", "black", "grey")}


class DoorsEnv(TextEnv):
    """Three doors, one key; an episode ends at the first door opened, or after ``max_turns`` looks."""

    task_type = "doors"  # the experience library and the report group episodes by it
    # What the agent is told: the system prompt, one example exchange (a small model needs it to answer in the
    # right form), and the last line of every user turn.
    instructions = Instructions(
        system="You are in a hall with doors. Reply with exactly one command from the list, nothing else.",
        example=((("Goal: open the door the key is behind.\nObservation: The key is behind the pink door.\n"
                  "Valid commands:\n- open pink door\n- open cyan door\n- look\nYour command:"), "open pink door"),),
        answer_cue="Your command:",
    )

    def __init__(self, split: str = "train", max_turns: int = 3):
        # slea builds training envs with env.kwargs and held-out ones with split="heldout" plus env.eval_kwargs
        super().__init__()
        self.colours, self.max_turns = COLOURS[split], max_turns

    def _reset(self, seed, options):
        game = self._pick(len(self.colours) * 3, seed, options)  # options["game"], else the seed, else random
        self._doors = [self.colours[(game + i) % len(self.colours)] for i in range(3)]
        self._key = self._doors[game % 3]
        self._turn = 0
        self._goal = "open the door the key is behind."
        self._admissible = [f"open {c} door" for c in self._doors] + ["look"]
        return f"A hall with three doors: {', '.join(self._doors)}. The key is behind the {self._key} door.", {}

    def _step(self, action):
        if action not in self._admissible:  # the collector only sends listed commands; direct callers may not
            return self._reject(f"not a valid command: {action!r}")
        self._turn += 1
        if action == "look":
            done = self._turn >= self.max_turns
            return f"The key is behind the {self._key} door.", 0.0, False, done, {}
        won = action == f"open {self._key} door"
        return ("You found the key!" if won else "An empty room."), float(won), True, False, {"won": won}


register("howto/Doors-v0", f"{__name__}:DoorsEnv", family="howto",
         description="three doors, one key (docs/howto.md)")
