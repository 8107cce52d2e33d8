"""What the agent sees of one running episode, and how a turn changes it: the one state machine behind every
prompt, shared by the rollout loop (:mod:`slea.rollout.collector`) and expert data (:mod:`slea.alignment.data`),
so a turn rendered from an expert's replay is the prompt a rollout in the same state would have built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from slea.policy.prompt_builder import PromptBuilder
from slea.types import Instructions

FEEDBACK_MAX_CHARS = 160


def invalid_feedback(state_obs: str, answer: str | None, info: dict[str, Any]) -> str:
    """What the agent is told after an invalid answer: the env's own answer when it differs from the state's
    observation (Search-R1's format hint, ScienceWorld's "No known action matches that input."), else the
    env's ``info["error"]``, else (an answer that never reached the env) that it is not a valid command."""
    if answer is not None and answer.strip() and answer.strip() != state_obs.strip():
        text = answer.strip()
    elif info.get("error"):
        text = str(info["error"]).strip()
    else:
        text = "it is not one of the valid commands."
    return text if len(text) <= FEEDBACK_MAX_CHARS else text[: FEEDBACK_MAX_CHARS - 3].rstrip() + "..."


@dataclass
class AgentView:
    """One episode as the agent sees it: the current observation and info, the goal (from the reset's info),
    the past (observation, action) pairs and, after an invalid answer, why it was invalid (shown once)."""

    obs: str
    info: dict[str, Any]
    goal: str = ""
    past: list[tuple[str, str]] = field(default_factory=list)
    feedback: str = ""
    # tool envs (``info["tools"]``): every turn as ``(answer, calls or None when invalid, results or why)``
    turns: list[tuple[str, list[dict[str, Any]] | None, str]] = field(default_factory=list)

    @classmethod
    def start(cls, obs: str, info: dict[str, Any]) -> AgentView:
        """The view after ``env.reset()``."""
        return cls(obs, info, goal=str(info.get("goal", "")))

    def shown(self) -> str:
        """The observation the prompt shows: the state's, after the feedback on an invalid last answer."""
        return f"Your last answer was invalid: {self.feedback}\n{self.obs}" if self.feedback else self.obs

    def messages(self, builder: PromptBuilder, instructions: Instructions, experience: str = ""
                 ) -> list[dict[str, str]]:
        """The chat messages of this turn's prompt (``builder.encode`` turns them into the prompt ids); a tool
        env's are the model's own tool exchanges (:meth:`PromptBuilder.tool_messages`)."""
        if self.info.get("tools"):
            first = self.past[0][0] if self.past else self.obs
            return builder.tool_messages(instructions, self.goal, first, self.turns, self.info["tools"], experience)
        return builder.messages(instructions, self.goal, self.shown(), self.info.get("admissible_actions"),
                                self.past, experience)

    def advance(self, answer: str, action: str | None, obs: str, info: dict[str, Any]) -> bool:
        """Record one turn: ``answer`` is the model's text, ``action`` what it was parsed into (None: invalid,
        the env was not stepped; then ``obs``/``info`` are ignored but for the feedback), ``obs``/``info`` the
        env's answer. Returns whether the turn was valid; only a valid turn moves to the new observation."""
        valid = action is not None and not info.get("invalid", False)
        self.past.append((self.obs, action if action is not None else f"{answer.strip()[:40]} (invalid)"))
        self.feedback = "" if valid else invalid_feedback(self.obs, obs if action is not None else None, info)
        if self.info.get("tools"):
            calls = json.loads(action) if valid and action is not None else None
            self.turns.append((answer, [calls] if isinstance(calls, dict) else calls, obs if valid else self.feedback))
        if valid:
            self.obs, self.info = obs, {**self.info, **info}
        return valid
