"""Play docs/howto/my_tools.py's env by hand, with calls as the rollout writes them, and print what the model sees.

    python docs/howto/play_tools.py

Run it from the repository root. It checks the schemas generated from the functions, that a bad call is an invalid
step with the reason, and that the right answer wins.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.getcwd())  # the repository root: `docs.howto.my_tools` is importable from there

from docs.howto.my_tools import OfficeEnv
from slea.envs import make

env = make("howto/Office-v0")  # what slea builds for training (held-out tasks: make(..., split="heldout"))
assert isinstance(env, OfficeEnv)
obs, info = env.reset(seed=3)
print("observation:", obs)
print("tools:", json.dumps(info["tools"][0]))


def call(tool: str, **arguments) -> tuple:
    """One turn making one call: the action is the JSON the rollout parses from the model's tool-call syntax."""
    obs, reward, terminated, _, info = env.step(json.dumps([{"name": tool, "arguments": arguments}]))
    written = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    print(f"{tool}({written}) ->", repr(obs), "| invalid:", info["invalid"], "| error:", info.get("error"))
    return obs, reward, terminated, info


person = obs.split("does ")[1].split(" work")[0]
assert call("find_city", name=person)[3]["invalid"]  # no such tool: an invalid step, the agent is told why
assert call("find_office", person=person)[3]["invalid"]  # an argument the function does not take
office = call("find_office", name=person)[0]
city = call("office_city", office=office)[0]
_, reward, terminated, info = call("answer", city=city)
print("reward:", reward, "| won:", info["won"])
assert reward == 1.0 and terminated and info["won"]
