"""From no valid call to learning (docs/howto.md, "Your own tools"): a tool environment of unit conversions,
registered as ``howto/Units-v0``, and a function that plays its tasks, the demonstrations it is taught from.

The agent is asked how many of one length unit are in a length of another (``How many m are 2.5 km?``). It can
call ``convert(value, unit, to)`` and ``answer(value)``; the answer ends the task, and the reward is 1 when the
value is right. ``play`` is the scripted play ``slea data demos --play docs.howto.my_units:play`` replays; the
same kind of demonstrations as a list of calls per task seed is in docs/howto/my_units_demos.json.
"""

from __future__ import annotations

import itertools
import json
import random
from fractions import Fraction
from typing import Any, ClassVar

from slea.envs import register
from slea.envs.tools import ToolEnv

MM = {"mm": 1, "cm": 10, "m": 1000, "km": 1_000_000}  # millimetres in one of each unit
VALUES = ["0.5", "1", "1.5", "2", "2.5", "3", "4", "5", "6", "7", "8", "9", "12", "15", "20", "25", "40", "60",
          "75", "120", "250", "500"]


def number(x: Fraction) -> int | float:
    """A length as a JSON number: an int when it is whole (2500, not 2500.0)."""
    return int(x) if x.denominator == 1 else float(x)


def convert(value: float, unit: str, to: str) -> str:
    """Convert a length from one unit to another.

    Args:
        value: The length.
        unit: Its unit: mm, cm, m or km.
        to: The unit to convert it to: mm, cm, m or km.
    """
    unknown = [u for u in (unit, to) if u not in MM]
    if unknown:
        return f"unknown unit {unknown[0]!r}; the units are {', '.join(MM)}"
    return f"{value} {unit} = {number(Fraction(str(value)) * MM[unit] / MM[to])} {to}"


def answer(value: float) -> str:
    """Give the final answer; this ends the task.

    Args:
        value: The length asked for, in the unit asked for.
    """
    return f"You answered {value}."


def tasks(split: str) -> list[dict[str, Any]]:
    """Every (value, unit, target unit) whose answer is between 0.001 and 1,000,000, shuffled once: two thirds for
    training, the other third held out (no held-out question is a training question)."""
    every = []
    for v, (unit, to) in itertools.product(VALUES, itertools.permutations(MM, 2)):
        exact = Fraction(v) * MM[unit] / MM[to]
        if Fraction(1, 1000) <= exact <= 1_000_000:
            value = number(Fraction(v))
            every.append({"goal": f"How many {to} are {value} {unit}?", "value": value, "unit": unit, "to": to,
                          "answer": number(exact)})
    random.Random(0).shuffle(every)
    cut = 2 * len(every) // 3
    return every[:cut] if split == "train" else every[cut:]


def reward(task: dict[str, Any], calls: list[dict[str, Any]]) -> float:
    """1 when the last answer is the task's length (to a millionth of it), else 0."""
    answers = [c for c in calls if c["name"] == "answer"]
    return float(bool(answers) and abs(answers[-1]["arguments"]["value"] - task["answer"]) <= 1e-6 * task["answer"])


class UnitsEnv(ToolEnv):
    task_type = "units"
    snapshots: ClassVar = "replay"  # no side effects: an episode replays from its seed

    def __init__(self, split: str = "train") -> None:
        super().__init__([convert, answer], tasks, reward, split=split)


register("howto/Units-v0", "docs.howto.my_units:UnitsEnv", family="tools", requires=("transformers",),
         description="docs/howto.md: convert a length with a tool, answer")


# The demonstrations: a function that plays one task, the way you would solve it with these tools.
def play(task: dict[str, Any], call) -> None:
    """``task``: the task dict the env picked (its goal and whatever the reward reads); ``call(tool, **arguments)``
    makes one call in a turn of its own and returns the tool's result, as the agent would see it."""
    result = call("convert", value=task["value"], unit=task["unit"], to=task["to"])  # "2.5 km = 2500 m"
    call("answer", value=json.loads(result.split(" = ")[1].split()[0]))
