"""Play docs/howto/my_env.py's env by hand, as slea's rollout loop does, and print what the trainer sees.

    python docs/howto/play_env.py

Run it from the repository root. It checks the contract the hooks must fill: ``info`` carries ``goal``,
``admissible_actions``, ``task_type`` and ``won``; a command outside the list is an invalid step, not an exception.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.getcwd())  # the repository root: `docs.howto.my_env` is importable from there

from docs.howto.my_env import DoorsEnv
from slea.envs import make

env = make("howto/Doors-v0")  # what slea builds for training (held-out games: make(..., split="heldout"))
assert isinstance(env, DoorsEnv)
obs, info = env.reset(seed=3)
print("observation:", obs)
print("goal:", info["goal"], "| valid commands:", info["admissible_actions"], "| task type:", info["task_type"])

obs, reward, terminated, truncated, info = env.step("dance")
print("'dance' ->", repr(obs), "invalid:", info["invalid"], "error:", info.get("error"))
assert info["invalid"] and reward == 0.0 and not terminated

key = obs.split("behind the ")[1].split(" door")[0]
obs, reward, terminated, truncated, info = env.step(f"open {key} door")
print(f"'open {key} door' ->", repr(obs), "reward:", reward, "won:", info["won"])
assert reward == 1.0 and terminated and info["won"]

held_out = make("howto/Doors-v0", split="heldout")
print("held-out game:", held_out.reset(seed=3)[0])
