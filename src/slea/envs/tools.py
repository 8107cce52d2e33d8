"""Tool environments: an agent is a set of typed, documented Python functions, a task source and a reward.

:class:`ToolEnv` is built from callables. Each one's JSON schema (the OpenAI ``tools`` format) is generated
from its signature and Google-style docstring by transformers' ``get_json_schema``, never written by hand; the
schemas are every info's ``info["tools"]``, which tells the rollout to render the prompt with the model's own
tool syntax (:mod:`slea.policy.tool_calls`) and to parse the model's answer into calls.

The action a tool env steps on is the canonical form of the calls the model made: a JSON list (or one object) of
``{"name": ..., "arguments": {...}}``. A step runs every call in order; the tool's return (``str()`` of it, or
JSON for dicts and lists) is the next observation; several calls give a JSON array of their results, one per
call. A call to an unknown tool, bad JSON, or arguments the function does not take (a missing or unexpected
name, a value of the wrong JSON type) is an invalid step whose ``info["error"]`` says why (the agent is shown
it), never a crash. A tool that raises, or runs past ``timeout_s``, is an env *fault* with its message
(:meth:`slea.envs.base.TextEnv._fault`: the episode ends, the pool rebuilds the env, nothing is learned from it).

The episode ends when a *final* tool is called (``final_tools``, e.g. ``answer``); ``reward(task, calls)`` is
then the episode's reward (``calls``: every valid call so far, ``{"name", "arguments", "result"}``), and the
episode is won when it reaches ``win_at``. Tasks are a list of dicts, or a callable ``tasks(split) -> list``;
each has a ``goal`` (the text shown) and anything the reward needs.

``slea/ToolCalc-v0`` is the built-in example: arithmetic questions, tools ``add``, ``multiply`` and ``answer``.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import random
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from slea.envs.base import StepResult, TextEnv, register
from slea.types import Instructions

MAX_CALLS_PER_STEP = 8
RESULT_MAX_CHARS = 4000
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list, tuple),
    "object": (dict,), "null": (type(None),),
}

TOOL_INSTRUCTIONS = Instructions(
    system="You are an agent that solves tasks by calling the tools you are given. Call one tool at a time and "
    "read its result; when you know the answer, call the tool that gives it.",
    answer_cue="",
    multiline=True,
)


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI-format schema of a typed, documented function (transformers' ``get_json_schema``: every
    argument needs a type hint and an ``Args:`` line in the docstring)."""
    from transformers.utils import get_json_schema

    return get_json_schema(fn)


def _result_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= RESULT_MAX_CHARS else text[: RESULT_MAX_CHARS - 3] + "..."


def _type_ok(value: Any, spec: dict[str, Any]) -> bool:
    kinds = spec.get("type")
    if kinds is None:
        return True
    kinds = kinds if isinstance(kinds, list) else [kinds]
    for kind in kinds:
        types = _JSON_TYPES.get(kind)
        if types is None:
            return True
        if isinstance(value, bool) and kind in ("integer", "number"):
            continue
        if isinstance(value, types):
            return "enum" not in spec or value in spec["enum"]
    return False


class ToolSet:
    """Callables, their generated schemas, and the check of an action's calls against them."""

    def __init__(self, tools: Sequence[Callable[..., Any]]) -> None:
        self.tools = {fn.__name__: fn for fn in tools}
        self.schemas = [tool_schema(fn) for fn in tools]
        self._params = {s["function"]["name"]: s["function"].get("parameters", {}) for s in self.schemas}

    def check(self, action: str) -> tuple[list[dict[str, Any]], str]:
        """The calls of an action, or ``([], why)`` when it is not a valid list of calls to these tools."""
        try:
            calls = json.loads(action)
        except (ValueError, RecursionError) as exc:
            return [], f"bad JSON in the tool call ({exc})"
        calls = [calls] if isinstance(calls, dict) else calls
        if not isinstance(calls, list) or not calls:
            return [], "a tool call is a JSON object with a name and arguments"
        if len(calls) > MAX_CALLS_PER_STEP:
            return [], f"at most {MAX_CALLS_PER_STEP} tool calls per turn"
        out = []
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return [], "a tool call is a JSON object with a name and arguments"
            name, args = call["name"], call.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except (ValueError, RecursionError):
                    return [], f"the arguments of {name} are not JSON"
            if name not in self.tools:
                return [], f"unknown tool {name[:40]!r}; the tools are: {', '.join(self.tools)}"
            if not isinstance(args, dict):
                return [], f"the arguments of {name} must be a JSON object"
            why = self._check_args(name, args)
            if why:
                return [], why
            out.append({"name": name, "arguments": args})
        return out, ""

    def _check_args(self, name: str, args: dict[str, Any]) -> str:
        params = self._params[name]
        props = params.get("properties", {})
        try:
            inspect.signature(self.tools[name]).bind(**args)
        except TypeError as exc:
            return f"wrong arguments for {name}: {exc}"
        for key, value in args.items():
            if key in props and not _type_ok(value, props[key]):
                return f"wrong arguments for {name}: {key} must be {props[key].get('type')}"
        return ""


class ToolEnv(TextEnv):
    """A tool environment from functions (module docstring). ``tools``: the callables; ``tasks``: a list of
    task dicts, or ``tasks(split)``; ``reward(task, calls) -> float``; ``final_tools``: the tools that end the
    episode; ``timeout_s``: a tool running longer is a fault."""

    instructions: ClassVar[Instructions] = TOOL_INSTRUCTIONS
    tool_env: ClassVar[bool] = True  # prompted in the model's own tool syntax, not with the text example
    task_type = "tools"
    snapshots: ClassVar = "none"  # a user's tools may have side effects; a deterministic subclass sets "replay"

    def __init__(self, tools: Sequence[Callable[..., Any]], tasks: Sequence[dict[str, Any]] | Callable[[str], Any],
                 reward: Callable[[dict[str, Any], list[dict[str, Any]]], float], *,
                 final_tools: Sequence[str] = ("answer",), win_at: float = 1.0, timeout_s: float = 10.0,
                 split: str = "train") -> None:
        super().__init__()
        self.toolset = ToolSet(tools)
        self.tools, self.schemas = self.toolset.tools, self.toolset.schemas
        self.tasks = list(tasks(split) if callable(tasks) else tasks)
        if not self.tasks:
            raise ValueError("ToolEnv: no tasks")
        self.reward_fn = reward
        self.final_tools = tuple(final_tools)
        self.win_at = float(win_at)
        self.timeout_s = float(timeout_s)
        self.split = split
        self._task: dict[str, Any] = {}
        self._calls: list[dict[str, Any]] = []
        self._done = True

    def _info_defaults(self) -> dict[str, Any]:
        return {"tools": self.schemas}

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._task = dict(self.tasks[self._pick(len(self.tasks), seed, options, "task")])
        self._goal = str(self._task.get("goal", ""))
        self._admissible = None
        self._calls = []
        self._done = False
        info: dict[str, Any] = {}
        if "walkthrough" in self._task:
            info["walkthrough"] = list(self._task["walkthrough"])
        return str(self._task.get("observation", self._goal)), info

    # -- a step: check every call (ToolSet.check), then run them -------------------------------------------
    def check(self, action: str) -> tuple[list[dict[str, Any]], str]:
        return self.toolset.check(action)

    def _run(self, name: str, args: dict[str, Any]) -> Any:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        try:
            future = pool.submit(self.tools[name], **args)
            try:
                return future.result(timeout=self.timeout_s)
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"tool {name} ran past {self.timeout_s:g} s") from None
        finally:
            pool.shutdown(wait=False)

    def _step(self, action: str) -> StepResult:
        if self._done:
            return self._reject("the episode is over; reset the env")
        calls, why = self.check(action)
        if not calls:
            return self._reject(why)
        results = []
        for call in calls:
            try:
                value = self._run(call["name"], call["arguments"])
            except Exception as exc:  # the tool failed: an env fault with its message (base.step), not a crash
                raise RuntimeError(f"tool {call['name']} failed: {type(exc).__name__}: {exc}") from exc
            results.append(_result_text(value))
            self._calls.append({**call, "result": results[-1]})
        obs = results[0] if len(results) == 1 else json.dumps(results, ensure_ascii=False)
        info: dict[str, Any] = {"tool_calls": len(calls)}
        if any(c["name"] in self.final_tools for c in calls):
            self._done = True
            reward = float(self.reward_fn(self._task, list(self._calls)))
            info["won"] = reward >= self.win_at
            return obs, reward, True, False, info
        return obs, 0.0, False, False, info


# -- the built-in example: arithmetic with tools ---------------------------------------------------------------
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


def answer(value: int) -> str:
    """Give the final answer; this ends the task.

    Args:
        value: The answer.
    """
    return f"Answered {value}."


def calc_tasks(split: str, n: int = 200) -> list[dict[str, Any]]:
    """``a * b + c`` questions (disjoint seeds per split); each with its expert's calls as ``walkthrough``."""
    rng = random.Random({"train": 0, "heldout": 1}.get(split, 2))
    out = []
    for _ in range(n):
        a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(1, 30)
        walk = [json.dumps([{"name": "multiply", "arguments": {"a": a, "b": b}}]),
                json.dumps([{"name": "add", "arguments": {"a": a * b, "b": c}}]),
                json.dumps([{"name": "answer", "arguments": {"value": a * b + c}}])]
        out.append({"goal": f"What is {a} * {b} + {c}?", "answer": a * b + c, "walkthrough": walk})
    return out


def calc_reward(task: dict[str, Any], calls: list[dict[str, Any]]) -> float:
    """1 when the last ``answer`` call gives the task's answer, else 0."""
    answers = [c for c in calls if c["name"] == "answer"]
    return float(bool(answers) and answers[-1]["arguments"].get("value") == task["answer"])


class ToolCalcEnv(ToolEnv):
    """``slea/ToolCalc-v0``: ``What is a * b + c?`` with tools add, multiply and answer."""

    task_type = "calc"
    snapshots: ClassVar = "replay"

    def __init__(self, split: str = "train", timeout_s: float = 10.0) -> None:
        super().__init__([add, multiply, answer], calc_tasks, calc_reward, split=split, timeout_s=timeout_s)


register("slea/ToolCalc-v0", "slea.envs.tools:ToolCalcEnv", family="tools",
         requires=("transformers",),
         description="arithmetic with tools add/multiply/answer (a ToolEnv built from Python functions)")
