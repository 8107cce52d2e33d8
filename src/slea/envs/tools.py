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

State key (:meth:`ToolEnv.state_key`): the tools called so far in order (the agent's own calls, which its
history shows) and the kind of the last result (:func:`result_kind`: a number, a list, an object and its keys,
a short or long text, a not-found or error text); the last calls' argument values and a short result are slots
(ToolCalc's first expert call: ``called multiply; last result: a number`` with ``{"multiply a": "8", "multiply b":
"8", "result": "64"}``; ToolCalc adds the question's numbers).

``slea/ToolCalc-v0`` is the built-in example: arithmetic questions, tools ``add``, ``multiply`` and ``answer``.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from slea.envs.base import StepResult, TextEnv, register
from slea.types import Instructions, StateKey

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


_ROLE_WORDS = re.compile(r"[a-z0-9]+")
_NOT_FOUND = re.compile(r"\b(?:error|not found|no results?|unknown|invalid|failed|none found)\b", re.IGNORECASE)
SHORT_RESULT = 60  # a result up to this many characters is a slot; a text result up to it is a "short text"


def _role(*words: str) -> str:
    return " ".join(w for word in words for w in _ROLE_WORDS.findall(word.lower()))


def result_kind(text: str) -> str:
    """The kind of a tool result, the names in it dropped: ``an empty result``, ``a number``, ``a boolean``,
    ``null``, ``an empty list``, ``a list of 1``, ``a list of several``, ``an object with keys <k1, k2...>`` (sorted,
    the first four), ``a not-found or error text``, ``a short text`` (up to :data:`SHORT_RESULT` characters) or ``a
    long text``."""
    text = text.strip()
    if not text:
        return "an empty result"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = text
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an empty list" if not value else "a list of 1" if len(value) == 1 else "a list of several"
    if isinstance(value, dict):
        keys = sorted(_role(str(k)) for k in value)
        return f"an object with keys {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}"
    text = str(value)
    if _NOT_FOUND.search(text):
        return "a not-found or error text"
    return "a short text" if len(text) <= SHORT_RESULT else "a long text"


def call_history(names: list[str], keep: int = 6) -> str:
    """Tool names in call order, repeats folded (``search x3``), the last ``keep`` runs (``...`` before them)."""
    runs: list[list[Any]] = []
    for name in names:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    words = [name if n == 1 else f"{name} x{n}" for name, n in runs]
    return ", ".join((["..."] if len(words) > keep else []) + words[-keep:])


def tool_state_key(calls: list[dict[str, Any]], last: int, observation: str, final_tools: Sequence[str] = ()
                   ) -> StateKey:
    """The generic state key of a tool env (:meth:`ToolEnv.state_key`) after ``calls`` (every valid call so far,
    ``{"name", "arguments"}``), the last ``last`` of them made in the step that returned ``observation``."""
    if not calls or last < 1:
        return StateKey("no tool called yet")
    step = calls[-last:]
    if last == 1:
        results = [observation]
    else:
        try:
            results = [str(r) for r in json.loads(observation)]
        except (ValueError, TypeError, RecursionError):
            results = [observation]
    kinds = " and ".join(dict.fromkeys(result_kind(r) for r in results))
    done = "done: " if any(c["name"] in final_tools for c in step) else ""
    text = f"{done}called {call_history([c['name'] for c in calls])}; last result{'s' if last > 1 else ''}: {kinds}"
    slots: dict[str, str] = {}
    for n, call in enumerate(step, start=1):
        for arg, value in call["arguments"].items():
            role = _role(call["name"], arg, str(n) if last > 1 else "")
            slots[role] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    for n, result in enumerate(results, start=1):
        if len(result.strip()) <= SHORT_RESULT:
            slots[_role("result", str(n) if len(results) > 1 else "")] = result.strip()
    return StateKey(text, slots)


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
        self._last_step_calls = 0  # how many of _calls the last valid step made (its results are the observation)
        self._done = True

    def _info_defaults(self) -> dict[str, Any]:
        return {"tools": self.schemas}

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._task = dict(self.tasks[self._pick(len(self.tasks), seed, options, "task")])
        self._goal = str(self._task.get("goal", ""))
        self._admissible = None
        self._calls = []
        self._last_step_calls = 0
        self._done = False
        info: dict[str, Any] = {}
        if "walkthrough" in self._task:
            info["walkthrough"] = list(self._task["walkthrough"])
        return str(self._task.get("observation", self._goal)), info

    def state_key(self, observation: str) -> StateKey | None:
        """The tools called so far and the kind of the last result (:func:`tool_state_key`), from the observation
        and the agent's own valid calls (its history shows them), never the task's hidden fields or the reward.
        Keeps the call order (repeats folded, the last six runs), the result's kind (:func:`result_kind`) and
        whether a final tool was called; drops argument values and results (slots ``<tool> <argument>`` of the
        last step's calls and ``result`` when it is at most :data:`SHORT_RESULT` characters). Example: ``called
        multiply; last result: a number`` with ``{"multiply a": "8", "multiply b": "8", "result": "64"}``."""
        return tool_state_key(self._calls, self._last_step_calls, observation, self.final_tools)

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
        self._last_step_calls = len(calls)
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


_CALC_GOAL = re.compile(r"What is (-?\d+) \* (-?\d+) \+ (-?\d+)\?")


class ToolCalcEnv(ToolEnv):
    """``slea/ToolCalc-v0``: ``What is a * b + c?`` with tools add, multiply and answer."""

    task_type = "calc"
    snapshots: ClassVar = "replay"

    def __init__(self, split: str = "train", timeout_s: float = 10.0) -> None:
        super().__init__([add, multiply, answer], calc_tasks, calc_reward, split=split, timeout_s=timeout_s)

    def state_key(self, observation: str) -> StateKey | None:
        """The generic tool key (:meth:`ToolEnv.state_key`) with the question's numbers, read from the goal, as
        the slots ``goal a``, ``goal b`` and ``goal c``: ``called multiply; last result: a number`` with
        ``{"multiply a": "8", "multiply b": "8", "result": "64", "goal a": "8", "goal b": "8", "goal c": "2"}``."""
        key = super().state_key(observation)
        m = _CALC_GOAL.fullmatch(self._goal.strip())
        if key is None or m is None:
            return key
        return StateKey(key.text, {**key.slots, "goal a": m[1], "goal b": m[2], "goal c": m[3]})


register("slea/ToolCalc-v0", "slea.envs.tools:ToolCalcEnv", family="tools",
         requires=("transformers",),
         description="arithmetic with tools add/multiply/answer (a ToolEnv built from Python functions)")
