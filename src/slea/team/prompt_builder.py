"""A team agent's prompt: its role's system message and example exchange, then the shared context.

Layout of the user message (:func:`team_turn`): ``Goal:`` (when there is one), ``Team transcript:`` (the last k
messages of the shared context as ``[speaker] text`` lines, oldest first, the latest observation included),
``Valid commands:`` (for an acting role when the env lists its actions) and the role's answer cue. Rendered by
the model's chat template, as single-agent prompts are (slea.policy.prompt_builder).
"""

from __future__ import annotations

from dataclasses import dataclass

from slea.team.context import Role, SharedContext


def team_turn(goal: str, transcript: list[str], commands: list[str] | None, cue: str) -> str:
    """The user text of one agent turn (module docstring)."""
    lines = [f"Goal: {goal.strip()}"] if goal.strip() else []
    lines += ["Team transcript:", *transcript]
    if commands:
        lines += ["Valid commands:", *(f"- {c}" for c in commands)]
    return "\n".join([*lines, cue])


@dataclass
class TeamPromptBuilder:
    tokenizer: object
    context_messages: int = 6
    message_max_chars: int = 300
    one_shot: bool = True

    def messages(self, role: Role, goal: str, context: SharedContext,
                 admissible: list[str] | None) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": role.system}]
        if self.one_shot:
            for user, assistant in role.example:
                msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        lines = context.transcript(self.context_messages, self.message_max_chars)
        msgs.append({"role": "user", "content": team_turn(goal, lines, admissible if role.acts else None,
                                                          role.cue)})
        return msgs

    def build(self, role: Role, goal: str, context: SharedContext, admissible: list[str] | None) -> list[int]:
        text = self.tokenizer.apply_chat_template(self.messages(role, goal, context, admissible),
                                                  add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)
