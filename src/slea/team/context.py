"""The shared text context of a team: every agent's messages and the environment's answers, in order.

TeamTR's team MDP (the TeamTR paper, §3): n agents share one text context; at each state one agent is active
(the router decides which), reads the whole context and appends its message. An *acting* agent's message is
also the environment action; the environment's answer is appended after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ENV = "env"  # the speaker name of the environment's messages
INVALID = "Invalid command: "  # how the environment's answer to an invalid move starts


@dataclass(frozen=True)
class Role:
    """One agent's part in a team task (slea.team.tasks; its LoRA adapter is named after ``name``)."""

    name: str
    system: str
    acts: bool  # its message is the environment action (else it only writes into the shared context)
    cue: str
    example: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Message:
    """One entry of the shared context: ``speaker`` is a role name or ``"env"``; ``agent`` its index (-1: env)."""

    speaker: str
    text: str
    agent: int = -1


@dataclass
class SharedContext:
    """The messages of one episode, oldest first."""

    messages: list[Message] = field(default_factory=list)

    def add(self, speaker: str, text: str, agent: int = -1) -> None:
        self.messages.append(Message(speaker, text, agent))

    @property
    def observation(self) -> str:
        """The environment's latest message (the state's raw observation: a team step row's anchor)."""
        return next((m.text for m in reversed(self.messages) if m.agent < 0), "")

    def speakers(self) -> list[str]:
        return [m.speaker for m in self.messages]

    def transcript(self, last: int, max_chars: int) -> list[str]:
        """The last ``last`` messages as ``[speaker] text`` lines, each clipped to ``max_chars`` (``...``)."""
        lines = []
        for m in self.messages[-last:]:
            text = " ".join(m.text.split())
            if len(text) > max_chars:
                text = text[: max_chars - 3].rstrip() + "..."
            lines.append(f"[{m.speaker}] {text}")
        return lines
