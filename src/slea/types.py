"""The shared vocabulary of slea: step rows and trajectories.

This module imports nothing of slea, so every other part can depend on it.
A rollout produces :class:`Step` rows (one per trajectory and turn); advantage estimators read them as
columns (:func:`columns`); the trainer broadcasts one advantage per row to that row's response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Step:
    """One decision of one trajectory: the prompt the policy saw, what it answered, what the env gave back.

    ``anchor`` is the raw environment observation the action was taken in (never the prompt with history);
    it is what GiGPO groups on and what SLEA-RL clusters. ``reward`` is the env reward of this turn (sparse
    tasks put the episode reward on the last turn); ``valid`` is false when the answer could not be parsed into
    an admissible action (the penalty, if any, is already part of ``reward``, and ``penalty`` says how much).
    """

    group_id: int
    traj_id: int
    step: int
    anchor: str
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    reward: float = 0.0
    penalty: float = 0.0
    done: bool = False
    valid: bool = True
    action: str = ""
    response_text: str = ""
    task_type: str = ""
    cluster_id: int = -1
    experience_ids: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    # the env's structural key of ``anchor`` (:class:`StateKey`): '' when the family has none
    state_key: str = ""
    state_slots: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StateKey:
    """An observation's structural key, given by its environment (``TextEnv.state_key``): what *kind* of state the
    agent is in, with the names of this game taken out.

    ``text`` is a short canonical text naming the kind of state, with every entity written as its role (``the
    goal's object``, ``a container``) and filler dropped, so two rooms that differ only in names and filler share
    it. ``slots`` maps each role to the entity that fills it in this observation (``{"goal object": "coin"}``):
    a lesson written with ``{goal object}`` is filled from them at retrieval. Both come only from what the agent
    sees (the observation, the goal, the listed commands), never from the answer, the reward or hidden state. Role
    names are lower-case words (letters, digits and spaces)."""

    text: str
    slots: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Instructions:
    """What an environment family tells the agent (its own, not one text-game prompt for all).

    ``system``: the system message (retrieved experiences are appended to it); ``example``: a fixed example
    exchange, ``(user, assistant)`` pairs rendered before the real turn (a 135M model needs one to answer in
    the right form at all); ``answer_cue``: the last line of the user message; ``multiline``: answers may span
    several lines (reasoning, then a tag), so generation does not stop at the first newline; ``one_call_per_turn``
    (a tool env): the env takes one tool call per turn, so generation stops at the end of the first call where
    the model's tool-call syntax marks one (``</tool_call>``: :attr:`slea.policy.tool_calls.ToolParser.call_end`).
    Whether actions
    come from a list is said per step by ``info["admissible_actions"]`` (a list, or ``None`` for free text the
    env parses). Observation clipping never touches any of these texts.
    """

    system: str
    example: tuple[tuple[str, str], ...] = ()
    answer_cue: str = "Your command:"
    multiline: bool = False
    one_call_per_turn: bool = False
    # the example exchange shown instead of ``example`` when experiences go into the user turn
    # (``rollout.experience_in: user``): its user turns hold an experience block in that layout, and the
    # assistant follows it; empty: ``example`` in both layouts
    example_with_experience: tuple[tuple[str, str], ...] = ()


@dataclass
class Trajectory:
    """A whole episode of one env copy. ``group_id`` names the task group (G identical copies share it)."""

    group_id: int
    traj_id: int
    goal: str = ""
    task_type: str = ""
    seed: int | None = None
    steps: list[Step] = field(default_factory=list)
    won: bool = False
    truncated: bool = False
    # The env's info at the episode's end, numbers and short strings only (``score``, ``em``, ``f1``, ``split``,
    # ``task``...): what evaluation tables need beyond ``won`` (slea.evaluation.report).
    final_info: dict[str, Any] = field(default_factory=dict)
    # Turn boundaries (env snapshot, exact prompt ids...) recorded when the collector is asked to
    # (``collect(boundaries=True)``, RTPO's trunks): one ``slea.rollout.collector.Boundary`` per turn played.
    boundaries: list[Any] = field(default_factory=list)

    @property
    def episode_return(self) -> float:
        """R(τ): the sum of the trajectory's per-step rewards."""
        return float(sum(s.reward for s in self.steps))

    @property
    def invalid_count(self) -> int:
        return sum(1 for s in self.steps if not s.valid)


def flatten(trajectories: list[Trajectory]) -> list[Step]:
    """The flat step-row table of a batch, in trajectory then turn order."""
    return [s for t in trajectories for s in t.steps]


def columns(steps: list[Step]) -> dict[str, np.ndarray]:
    """Column view of step rows, the input of :func:`slea.algorithms.compute_advantages`."""
    return {
        "group_ids": np.asarray([s.group_id for s in steps], dtype=np.int64),
        "traj_ids": np.asarray([s.traj_id for s in steps], dtype=np.int64),
        "steps": np.asarray([s.step for s in steps], dtype=np.int64),
        "rewards": np.asarray([s.reward for s in steps], dtype=np.float64),
        "anchors": np.asarray([s.anchor for s in steps], dtype=object),
        "clusters": np.asarray([s.cluster_id for s in steps], dtype=np.int64),
    }
