"""Lessons about a kind of state, with the entities as placeholders: written from one game, filled in another.

A state key's slots (:class:`slea.types.StateKey`) name the entity that plays each role in an observation
(``{"goal object": "coin"}``). :func:`abstract` writes a lesson's text with ``{goal object}`` where the step it was
learned from had ``coin``; :func:`instantiate` fills the placeholders from the slots of the step that retrieves it,
so ``take {goal object}`` reads ``take sock`` in a game whose goal names a sock (Agent Workflow Memory's variables,
Wang et al. 2024, in a per-step library). A lesson with a placeholder the step has no slot for is not shown: a
retrieved lesson names only entities the step's observation has.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["PLACEHOLDER", "abstract", "instantiate", "placeholders"]

PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9 ]*)\}")


def placeholders(text: str) -> list[str]:
    """The roles ``text``'s placeholders name, in order of first appearance."""
    return list(dict.fromkeys(PLACEHOLDER.findall(text)))


def abstract(text: str, slots: Mapping[str, str]) -> str:
    """``text`` with each slot's entity replaced by ``{role}``: whole words, case-insensitive, the longest entity
    first (``red apple`` before ``apple``). Entities shorter than 2 characters are left alone."""
    by_name = {name.strip().lower(): role for role, name in slots.items() if len(name.strip()) >= 2}
    if not by_name:
        return text
    order = sorted(by_name, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w{-])(" + "|".join(map(re.escape, order)) + r")(?![\w}-])", re.IGNORECASE)
    return pattern.sub(lambda m: "{" + by_name[m.group(1).lower()] + "}", text)


def instantiate(text: str, slots: Mapping[str, str]) -> str | None:
    """``text`` with every ``{role}`` filled from ``slots``, or None when a role has no slot here (the lesson
    would name an entity this observation does not have). A text without placeholders comes back as it is."""
    missing = [r for r in placeholders(text) if not str(slots.get(r, "")).strip()]
    if missing:
        return None
    return PLACEHOLDER.sub(lambda m: str(slots[m.group(1)]).strip(), text)
