"""Tool steps in lessons: a tool env's action written as a readable call.

A tool environment (:mod:`slea.envs.tools`, docs/envs/tools.md) steps on the calls the model made, as JSON
(``[{"name": "search", "arguments": {"query": "capital of France"}}]``); its observations are the tool results.
Lessons name such a step as a call, ``search(query="capital of France")`` (:func:`describe_call`), never as the
JSON array. Whether a step is a tool step is read from the data, never from an env id: its action parses as a
list of calls, or its row records the env's tool names (``Step.info["tools"]``, which the collector copies from
the env's ``info["tools"]``; a step whose answer held no call at all has only that).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from slea.types import Step, Trajectory

MAX_VALUE_CHARS = 40  # one argument's value, as written in a call
MAX_CALL_CHARS = 120  # a whole description (several calls of one step are joined by "; ")


def parse_calls(action: object) -> list[dict[str, Any]] | None:
    """The calls of a tool step's action (``{"name", "arguments"}`` each), or ``None`` when it is not one: a text
    command, prose, bad JSON, or JSON that is not a call or a list of calls."""
    text = action.strip() if isinstance(action, str) else ""
    if not text or text[0] not in "[{":
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    calls = [obj] if isinstance(obj, dict) else obj
    if not isinstance(calls, list) or not calls:
        return None
    if not all(isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"].strip() for c in calls):
        return None
    return [{"name": c["name"].strip(), "arguments": c.get("arguments", {})} for c in calls]


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _value(value: Any) -> str:
    """An argument's value as JSON (strings quoted, numbers bare), one line, cut at :data:`MAX_VALUE_CHARS`."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= MAX_VALUE_CHARS:
        return text
    return text[: MAX_VALUE_CHARS - 2].rstrip() + ('…"' if isinstance(value, str) else "…")


def _one(call: dict[str, Any]) -> str:
    args = call["arguments"]
    if isinstance(args, str):  # the env accepts arguments given as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            pass
    inner = (", ".join(f"{_clip(str(k), 30)}={_value(v)}" for k, v in args.items()) if isinstance(args, dict)
             else _value(args))
    return f"{_clip(' '.join(call['name'].split()), 40)}({inner})"


def describe_call(action: object, max_chars: int = MAX_CALL_CHARS) -> str | None:
    """A tool step's action as readable calls: ``[{"name": "search", "arguments": {"query": "capital of
    France"}}]`` → ``search(query="capital of France")``; several calls joined by ``"; "``; long values and the
    whole cut with an ellipsis. ``None`` when ``action`` is not tool calls (:func:`parse_calls`)."""
    calls = parse_calls(action)
    if calls is None:
        return None
    return _clip("; ".join(_one(c) for c in calls), max_chars)


def call_names(action: object) -> list[str]:
    """The tool names an action calls, in order (empty when it is not tool calls)."""
    return [c["name"] for c in parse_calls(action) or []]


def is_tool_step(step: Step) -> bool:
    """Whether ``step`` was taken in a tool env: its action is tool calls, or its row records the env's tools."""
    return bool(step.info.get("tools")) or parse_calls(step.action) is not None


def is_tool_trajectory(t: Trajectory) -> bool:
    return any(is_tool_step(s) for s in t.steps)


def tool_names(steps: Iterable[Step]) -> list[str]:
    """The env's tool names as the rows recorded them (``Step.info["tools"]``), else the tools called."""
    steps = list(steps)
    for s in steps:
        names = s.info.get("tools")
        if isinstance(names, list | tuple) and names:
            return [str(n) for n in names]
    return list(dict.fromkeys(n for s in steps if s.valid for n in call_names(s.action)))


def step_error(step: Step, max_chars: int = 160) -> str:
    """Why an invalid step was rejected, as the env or the tool-call parser said (``Step.info["error"]``), one
    line, without a closing period; ``''`` when the row does not say."""
    why = " ".join(str(step.info.get("error") or "").split()).rstrip(".")
    return _clip(why, max_chars)
