"""Prompt building and tolerant action parsing.

Prompt = the env family's :class:`~slea.types.Instructions`: its system prompt (+ retrieved experiences,
SLEA-RL App. A Eq.8: experiences go in the system message, the observation stays in the user message) and its
example exchange (a 135M model needs one to answer in the right form at all); then the
goal, a one-line summary of the older actions (``rollout.history_summary``), the last k (observation, action)
pairs, the current observation, the admissible actions and the family's answer cue, rendered by the model's chat
template. ``rollout.experience_in: user`` moves the experiences into the user turn, just before the answer cue
(and shows the family's ``example_with_experience`` when it has one). Only observations are clipped: the
instructions and the example always appear whole.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slea.envs.base import user_turn
from slea.policy import tool_calls
from slea.types import Instructions

if TYPE_CHECKING:
    from slea.config import RolloutSection

_LEAD = " \t\r\f\v\"'`*>-•.:"
_TRAIL = " \t\r\f\v\"'`*.!,;:"
_PREFIX = re.compile(r"^(?:your\s+)?(?:command|action|answer)\s*[:=]\s*", re.IGNORECASE)
_BANNER = re.compile(r"\n{3,}")


def _strip(line: str) -> str:
    """Quotes, bullets and punctuation around a command (str.strip: linear, unlike an anchored regex)."""
    return line.lstrip(_LEAD).rstrip(_TRAIL)


def clip_observation(text: str, max_chars: int) -> str:
    """An observation with runs of blank lines collapsed, cut to ``max_chars`` (ending in ``...``)."""
    text = _BANNER.sub("\n\n", text.strip())
    return text if len(text) <= max_chars else text[: max_chars - 3].rstrip() + "..."


@dataclass
class PromptBuilder:
    tokenizer: Any
    history: int = 2
    obs_max_chars: int = 400
    one_shot: bool = True
    summary: bool = False  # ψ = summary: the turns before the window as one line of their actions
    experience_in: str = "system"  # where retrieved experiences go: "system" (SLEA-RL Eq.8) or "user"
    tool_parser: str | None = None  # tool envs: the tool-call syntax (None: chosen from the chat template)

    @classmethod
    def from_rollout(cls, tokenizer, rollout: RolloutSection) -> PromptBuilder:
        """The builder a run's rollouts use: history window, observation clipping and the one-shot example from
        its ``rollout`` config section (every prompt of a run, rollouts and expert data, comes from here)."""
        return cls(tokenizer, history=rollout.history, obs_max_chars=rollout.obs_max_chars, one_shot=rollout.one_shot,
                   summary=rollout.history_summary, experience_in=rollout.experience_in,
                   tool_parser=getattr(rollout, "tool_parser", None))

    def earlier(self, past: list[tuple[str, str]]) -> str:
        """The summary ψ's line: the actions of the turns before the history window, oldest first, as many of the
        latest as fit in half the observation budget (``…`` marks dropped ones); "" when off or nothing is older."""
        older = past[: len(past) - self.history] if self.summary else []
        if not older:
            return ""
        acts = [" ".join(act.split()) or "(empty)" for _, act in older]
        budget = self.obs_max_chars // 2
        kept: list[str] = []
        for act in reversed(acts):
            if len("; ".join([act, *kept])) > budget and kept:
                break
            kept.insert(0, act)
        head = "…; " if len(kept) < len(acts) else ""
        n = len(acts)
        return f"{head}{'; '.join(kept)} ({n} turn{'' if n == 1 else 's'})"

    def messages(self, instructions: Instructions, goal: str, observation: str, admissible: list[str] | None,
                 past: list[tuple[str, str]], experience: str = "") -> list[dict[str, str]]:
        """Chat messages: ``instructions.system`` (+ experience), the example exchange when ``one_shot``, then
        the user turn (goal, recent steps, clipped observation, valid commands, ``instructions.answer_cue``).
        With ``experience_in="user"`` the experience is the user turn's last block before the cue instead, and
        the example is ``instructions.example_with_experience`` when the family has one."""
        in_user = self.experience_in == "user"
        system = instructions.system if not experience or in_user else f"{instructions.system}\n\n{experience}"
        msgs = [{"role": "system", "content": system}]
        if self.one_shot:
            example = (instructions.example_with_experience or instructions.example) if in_user \
                else instructions.example
            for user, assistant in example:
                msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        recent = [f"[{clip_observation(obs, self.obs_max_chars // 2)}] > {act}"
                  for obs, act in (past[-self.history:] if self.history else [])]
        msgs.append({"role": "user", "content": user_turn(goal, clip_observation(observation, self.obs_max_chars),
                                                          admissible, instructions.answer_cue, recent,
                                                          self.earlier(past), experience if in_user else "")})
        return msgs

    def tool_syntax(self) -> tuple[tool_calls.ToolParser, bool]:
        """A tool env's call syntax for this tokenizer: ``(parser, native)``; ``native``: the chat template renders
        ``tools`` and ``role: "tool"`` messages itself (else the fallback rendering, :mod:`slea.policy.tool_calls`)."""
        native = tool_calls.supports_tools(self.tokenizer)
        return tool_calls.parser_for(self.tokenizer, self.tool_parser), native

    def tool_messages(self, instructions: Instructions, goal: str, first_obs: str,
                      turns: list[tuple[str, list[dict[str, Any]] | None, str]], schemas: list[dict[str, Any]],
                      experience: str = "") -> list[dict[str, Any]]:
        """Chat messages of a tool env's turn: the system message (with the experience; its ``tools`` key holds
        the schemas that :meth:`encode` hands the template, or, in the fallback rendering, the schemas written
        into it), the task (goal, and the first observation when it differs), then the last ``history`` turns as
        the model's own exchanges: a valid turn is the assistant's calls and their results (``role: "tool"``,
        or the fallback's ``<tool_response>`` user message); an invalid one is the answer as text and a user
        message saying why. ``turns``: ``(answer, calls or None when invalid, results or why)``."""
        parser, native = self.tool_syntax()
        system = instructions.system if not experience else f"{instructions.system}\n\n{experience}"
        head: dict[str, Any] = {"role": "system", "content": system}
        if native:
            head["tools"] = schemas
        else:
            head["content"] = f"{system}\n\n{tool_calls.fallback_system(schemas)}"
        task = clip_observation(first_obs, self.obs_max_chars)
        if goal.strip() and goal.strip() not in task:
            task = f"{goal.strip()}\n{task}"
        msgs: list[dict[str, Any]] = [head, {"role": "user", "content": task or goal.strip()}]
        shown = turns[-self.history:] if self.history else []
        for answer, calls, told in shown:
            if calls is None:
                msgs += [{"role": "assistant", "content": answer.strip()[:200]},
                         {"role": "user", "content": f"Your last answer was invalid: {told}"}]
                continue
            results = [told]
            if len(calls) > 1:
                try:
                    results = [str(r) for r in json.loads(told)]
                except (ValueError, TypeError, RecursionError):
                    results = [told]
                results = (results + [""] * len(calls))[: len(calls)]
            results = [clip_observation(r, self.obs_max_chars) for r in results]
            if native and not parser.multi_call:  # Llama-3.x's template takes one call per assistant turn
                for call, result in zip(calls, results):
                    msgs.append(tool_calls.assistant_message([call], native, parser))
                    msgs += tool_calls.result_messages([call], [result], native)
                continue
            msgs.append(tool_calls.assistant_message(calls, native, parser))
            msgs += tool_calls.result_messages(calls, results, native)
        return msgs

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt ids of chat messages (a system message with a ``tools`` key renders those tools)."""
        tools = messages[0].get("tools") if messages else None
        kw = {"tools": tools} if tools else {}
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def build(self, instructions: Instructions, goal: str, observation: str, admissible: list[str] | None,
              past: list[tuple[str, str]], experience: str = "") -> list[int]:
        return self.encode(self.messages(instructions, goal, observation, admissible, past, experience))


def parse_action(text: str, admissible: list[str] | None, fuzzy_cutoff: float = 0.75) -> tuple[str | None, str]:
    """Map free model text to an action: ``(action, kind)``, kind in exact|contained|fuzzy|free|invalid.

    Never raises. With an admissible list, the first non-empty line is matched exactly (case-insensitive),
    then by containment (longest admissible command found inside it), then by difflib closeness; otherwise
    the answer is invalid. Without a list (open action space: search tags, ``search[...]``) the stripped raw
    answer is the action and the env parses it.
    """
    if not isinstance(text, str):
        return None, "invalid"
    if admissible is None:  # open action space: the env parses the raw answer (tags, search[...], ...)
        raw = text.strip()[:4000]
        return (raw, "free") if raw else (None, "invalid")
    line = next((ln for ln in text.splitlines() if ln.strip()), "")[:1000]
    line = _PREFIX.sub("", _strip(line)).strip()
    line = _strip(line).lower()
    if not line:
        return None, "invalid"
    lowered = {a.lower().strip(): a for a in admissible}
    if line in lowered:
        return lowered[line], "exact"
    inside = [a for a in lowered if a and re.search(rf"(?<!\w){re.escape(a)}(?!\w)", line)]
    if inside:
        return lowered[max(inside, key=len)], "contained"
    close = difflib.get_close_matches(line[:200], list(lowered), n=1, cutoff=fuzzy_cutoff)
    if close:
        return lowered[close[0]], "fuzzy"
    return None, "invalid"
