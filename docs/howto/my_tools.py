"""Your own tools (docs/howto.md, "Your own tools"): three typed, documented Python functions, tasks and a reward
make a tool environment, registered as ``howto/Office-v0``.

The agent is asked in which city someone works. It can look the person's office up, look the office's city up,
and answer; the answer ends the task, and the reward is 1 when the city is right.
"""

from __future__ import annotations

from typing import Any, ClassVar

from slea.envs import register
from slea.envs.tools import ToolEnv

OFFICE = {"Ada": "B-12", "Alan": "C-3", "Barbara": "A-7", "Claude": "B-4", "Donald": "C-9", "Edsger": "A-2",
          "Grace": "B-12", "John": "C-3", "Ken": "A-7", "Linus": "C-9"}
CITY = {"A-2": "Porto", "A-7": "Zurich", "B-4": "Lisbon", "B-12": "Lisbon", "C-3": "Oslo", "C-9": "Turin"}


# 1. The tools: type hints and an Args: line per argument; the schema the model sees is generated from them.
def find_office(name: str) -> str:
    """Find the office of a person.

    Args:
        name: The person's first name.
    """
    return OFFICE.get(name.strip().title(), f"nobody called {name!r} works here")


def office_city(office: str) -> str:
    """Find the city an office is in.

    Args:
        office: An office code, such as A-7.
    """
    return CITY.get(office.strip().upper(), f"there is no office {office!r}")


def answer(city: str) -> str:
    """Give the final answer; this ends the task.

    Args:
        city: The city.
    """
    return f"You answered {city}."


# 2. The tasks (each with the goal the agent is given) and the reward of a finished episode.
def tasks(split: str) -> list[dict[str, Any]]:
    """Half the people for training, the other half held out."""
    names = sorted(OFFICE)[split != "train"::2]
    return [{"goal": f"In which city does {n} work?", "city": CITY[OFFICE[n]]} for n in names]


def reward(task: dict[str, Any], calls: list[dict[str, Any]]) -> float:
    """1 when the last answer names the task's city (``calls``: every valid call, with its result)."""
    answers = [c for c in calls if c["name"] == "answer"]
    return float(bool(answers) and answers[-1]["arguments"]["city"].strip().lower() == task["city"].lower())


# 3. The environment: a ToolEnv subclass that takes split (held-out evaluation builds it with split="heldout").
class OfficeEnv(ToolEnv):
    task_type = "office"
    snapshots: ClassVar = "replay"  # the tools have no side effects: an episode replays from its seed

    def __init__(self, split: str = "train") -> None:
        super().__init__([find_office, office_city, answer], tasks, reward, split=split)


# 4. The id a config names (env.id); the config lists this module under plugins so it is imported first.
register("howto/Office-v0", "docs.howto.my_tools:OfficeEnv", family="tools", requires=("transformers",),
         description="docs/howto.md: find a person's office, its city, answer")
