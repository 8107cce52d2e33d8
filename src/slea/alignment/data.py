"""Expert trajectories for offline alignment, rendered exactly as the agent sees its prompts at rollout.

tlm-DRE, ETO and DIL start from a policy fine-tuned on expert trajectories. Every
env family that has an expert names it (``TextEnv.expert_source``) and gives its actions from the initial state
in the reset's ``info["walkthrough"]``:

============  ================  ====================================================================
source        families          what the expert does
============  ================  ====================================================================
walkthrough   TextWorld         the game's walkthrough
gold_path     ScienceWorld      the engine's gold action sequence
expert_plan   ALFWorld          the stored expert run (generated games: the hand-coded expert's win)
goal_product  WebShop (offline) search, open the goal's product, choose its options, buy
gold_answer   Search-QA         ``<search>question</search>`` (a retrieval step), then the gold answer (the
                                tools version: the same as ``search`` and ``answer`` calls)
solver        Sokoban           a shortest solution (BFS)
sampled       (any)             a trajectory sampled from a policy (the failures the pairs are built from)
demonstration tool envs         a user's scripted plays: calls per task, or a function that plays a task
============  ================  ====================================================================

:func:`replay_expert` plays those actions in the real env and renders each turn through the rollout's own
state machine (:class:`slea.rollout.view.AgentView`) and prompt builder (the family's instructions, the history
window, observation clipping, the one-shot example), and every expert action goes through the rollout's parser
(``parse_action``) before it steps the env: an action the rollout would not play as written, or that the env
refuses, is left out (and counted); a replay that does not end in a win within the step budget is dropped (and
counted).

A tool env of a user's own (:class:`slea.envs.tools.ToolEnv`) has no expert of its own; the user scripts one.
:func:`replay_demonstration` plays a *demonstration* (a list of calls per turn for a task seed, or a function
``play(task, call)`` that makes the calls and reads their results) in the real env through the same state
machine and prompt builder, so its turns are the prompts a rollout renders and the answers a model making those
calls writes. It is strict where the expert replay forgives: a call the env refuses, a tool that fails, a play
that goes on after the episode ended, runs past the step budget, or does not end in a win drops the
demonstration, with the reason.

A turn stores chat messages and the action text, not token ids, so a data file serves any tokenizer;
:func:`encode_turn` gives the ids a training step needs: the prompt as ``PromptBuilder.encode`` renders it, and
the response a rollout would have produced for that action: the action's tokens, then the end-of-turn token
(EOS: where the generator stops, and what the chat template puts after an assistant message; the generator
keeps the stop token in a step's response ids).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from slea.atomic import atomic_open
from slea.envs.base import env_class, make
from slea.policy.prompt_builder import PromptBuilder, parse_action
from slea.rollout.collector import final_info
from slea.rollout.view import AgentView

SOURCES = ("walkthrough", "gold_path", "expert_plan", "goal_product", "gold_answer", "solver", "sampled",
           "demonstration")


@dataclass
class Turn:
    """One decision: the chat messages of its prompt and the action answered.

    ``response_ids``: the exact response ids when the turn was sampled from a policy (they may end without EOS,
    at a newline or at the token budget); None for an expert turn, whose ids :func:`encode_turn` derives from
    ``action``."""

    messages: list[dict[str, str]]
    action: str
    response_ids: list[int] | None = None


@dataclass
class EpisodeRecord:
    """One episode of alignment data, with its provenance.

    ``task`` names the task instance, :func:`task_id` of split and env seed (``"train:3"``): what expert and
    sampled trajectories of one task share, and what pairs are made on (``slea.alignment.pairs``); ``goal`` is
    the goal text the agent saw (two games may share one). ``source`` is one of
    :data:`SOURCES`; ``ret`` the sum of the env's rewards. ``prompt`` records the prompt settings the turns
    were rendered with (``history``, ``obs_max_chars``, ``one_shot``), so a consumer can check that they match
    its rollouts'; ``final_info`` the numbers and short strings of the env's last info (``score``, ``em``...);
    ``skipped`` the expert actions left out of a replay (:func:`replay_expert`)."""

    env: str
    task: str
    split: str
    seed: int
    source: str
    success: bool
    ret: float
    turns: list[Turn]
    goal: str = ""
    task_type: str = ""
    skipped: int = 0
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt: dict[str, Any] = field(default_factory=dict)
    final_info: dict[str, Any] = field(default_factory=dict)


def task_id(split: str, seed: int) -> str:
    """The id of the task an env plays when reset with ``seed`` on ``split``: ``"<split>:<seed>"``."""
    return f"{split}:{int(seed)}"


# -- files ------------------------------------------------------------------------------------------------------
def to_dict(traj: EpisodeRecord) -> dict[str, Any]:
    out = dataclasses.asdict(traj)
    for t in out["turns"]:
        if t["response_ids"] is None:
            del t["response_ids"]
    return out


def from_dict(row: dict[str, Any]) -> EpisodeRecord:
    """A trajectory from its JSON object; a missing, unknown or mistyped field raises ``ValueError`` (``TypeError``) naming it."""
    if not isinstance(row, dict):
        raise TypeError(f"expected a JSON object, got {type(row).__name__}")
    names = {f.name for f in dataclasses.fields(EpisodeRecord)}
    unknown = sorted(set(row) - names)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    required = [f.name for f in dataclasses.fields(EpisodeRecord)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in row]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}")
    if row["source"] not in SOURCES:
        raise ValueError(f"source {row['source']!r} is not one of {', '.join(SOURCES)}")
    if not isinstance(row["turns"], list):
        raise TypeError("turns: expected a list")
    turns = [_turn(t, k) for k, t in enumerate(row["turns"])]
    return EpisodeRecord(**{**row, "turns": turns, "seed": int(row["seed"]), "ret": float(row["ret"]),
                         "success": bool(row["success"])})


def _turn(row: Any, k: int) -> Turn:
    shaped = isinstance(row, dict) and isinstance(row.get("action"), str) and isinstance(row.get("messages"), list)
    if not shaped:
        raise ValueError(f"turns[{k}]: expected {{'messages': [...], 'action': str}}")
    if any(not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str)
           for m in row["messages"]):
        raise ValueError(f"turns[{k}].messages: expected {{'role': str, 'content': str}} objects")
    ids = row.get("response_ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, int) for i in ids)):
        raise ValueError(f"turns[{k}].response_ids: expected a list of ints")
    return Turn(messages=row["messages"], action=row["action"], response_ids=ids)


def save_jsonl(path: str | Path, trajectories: list[EpisodeRecord]) -> Path:
    """Write one trajectory per line, atomically (a killed write leaves the old file or none)."""
    with atomic_open(path) as fh:
        for traj in trajectories:
            fh.write(json.dumps(to_dict(traj), ensure_ascii=False) + "\n")
    return Path(path)


def load_jsonl(path: str | Path) -> list[EpisodeRecord]:
    """Read a file written by :func:`save_jsonl`; a malformed line raises ``ValueError`` naming file and line."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(from_dict(json.loads(line)))
            except (json.JSONDecodeError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{n}: {exc}") from None
    return out


# -- token ids ----------------------------------------------------------------------------------------------------
def action_ids(tokenizer, action: str) -> list[int]:
    """The response ids a rollout produces when the policy answers ``action``: its tokens, then EOS (the
    generator stops there and keeps the stop token; the chat template closes an assistant message with it)."""
    return list(tokenizer(action, add_special_tokens=False).input_ids) + [int(tokenizer.eos_token_id)]


def encode_turn(builder: PromptBuilder, turn: Turn) -> tuple[list[int], list[int]]:
    """``(prompt_ids, response_ids)`` of a turn with ``builder``'s tokenizer: the prompt exactly as the rollout
    encodes it, the response as :func:`action_ids` (or the turn's own sampled ids)."""
    prompt = builder.encode(turn.messages)
    response = list(turn.response_ids) if turn.response_ids is not None else action_ids(builder.tokenizer,
                                                                                           turn.action)
    return prompt, response


def turns_over_budget(trajectories: list[EpisodeRecord], tokenizer, max_new_tokens: int) -> int:
    """How many expert turns need more response tokens (EOS included) than ``max_new_tokens``: a rollout with
    that budget would cut them (raise ``rollout.max_new_tokens``)."""
    return sum(len(action_ids(tokenizer, t.action)) > max_new_tokens
               for traj in trajectories for t in traj.turns if t.response_ids is None)


# -- expert replay ------------------------------------------------------------------------------------------------
def expert_source(env_id: str) -> str | None:
    """The expert source an env id's family declares (None: it has no expert); builds nothing."""
    return env_class(env_id).expert_source


def replay_expert(env, env_id: str, seed: int, builder: PromptBuilder, *, split: str = "",
                  max_steps: int | None = None, fuzzy_cutoff: float = 0.75,
                  env_kwargs: dict[str, Any] | None = None) -> tuple[EpisodeRecord | None, str]:
    """Play the expert's actions on ``env`` reset with ``seed``; ``(trajectory, "")``, or ``(None, why)`` when
    the replay is not a win within the step budget (``why``: ``no expert actions``, ``too many steps``,
    ``not won``).

    Each turn's prompt is rendered from the state the rollout would be in (:class:`AgentView`). An expert action
    that the rollout's parser would not play as written (not in the valid-command list: a fuzzy match would
    step *another* command) or that the env refuses (``invalid``: no effect) is left out and counted in
    ``EpisodeRecord.skipped``; ScienceWorld's gold paths hold such no-ops ("open door to kitchen" when it is
    open). The replay must still end in a win.

    A tool env's expert steps are canonical calls (JSON); each turn's answer is those calls in the model's
    tool-call syntax (:func:`tool_answer`), so the turn's response is what a rollout making them generates. The
    syntax is ``builder``'s: with no tokenizer (``slea data expert``, the ``expert`` stage of ``slea align``)
    the fallback rendering's ``<tool_call>`` blocks: a rollout's own prompts for a template without tools (the
    embedded SmolLM2's), not for one that renders tools (Qwen's), whose rollouts it does not match."""
    source = getattr(env, "expert_source", None)
    obs, info = env.reset(seed=seed)
    view = AgentView.start(obs, info)
    actions = [str(a) for a in (info.get("walkthrough") or [])]
    if not actions or source is None:
        return None, "no expert actions"
    turns: list[Turn] = []
    ret, done, skipped = 0.0, False, 0
    for step_action in actions:
        if view.info.get("tools"):
            text, action = tool_answer(step_action, builder)
        else:  # the command as the rollout's parser reads it (the answer is that command)
            action, kind = parse_action(step_action, view.info.get("admissible_actions"), fuzzy_cutoff)
            text = action = action if kind in ("exact", "free") else None
        if action is None:
            skipped += 1
            continue
        if max_steps is not None and len(turns) >= max_steps:
            return None, "too many steps"
        messages = view.messages(builder, env.instructions)
        obs, reward, terminated, truncated, step_info = env.step(action)
        if step_info.get("invalid"):
            skipped += 1
            continue
        info = step_info
        view.advance(text, action, obs, info)
        turns.append(Turn(messages, text))
        ret += float(reward)
        if terminated or truncated:
            done = True
            break
    if not (done and info.get("won")):
        return None, "not won"
    return _won(env_id, split, seed, source, view.goal, info, turns, ret, builder, skipped=skipped,
                env_kwargs=env_kwargs), ""


def _won(env_id: str, split: str, seed: int, source: str, goal: str, info: dict[str, Any], turns: list[Turn],
         ret: float, builder: PromptBuilder, *, skipped: int = 0,
         env_kwargs: dict[str, Any] | None = None) -> EpisodeRecord:
    """The record of a replay that ended in a win (``info``: the env's last info)."""
    return EpisodeRecord(env=env_id, task=task_id(split, seed), split=split, seed=int(seed), source=source,
                         success=True, ret=ret, turns=turns, goal=goal, task_type=str(info.get("task_type", "")),
                         skipped=skipped, env_kwargs=dict(env_kwargs or {}), prompt=prompt_settings(builder),
                         final_info=final_info(info))


def tool_answer(calls_json: str, builder: PromptBuilder) -> tuple[str, str | None]:
    """A tool env's expert step (the canonical calls as JSON, :mod:`slea.envs.tools`) as the model would answer
    it: ``(text, action)``, ``text`` the calls written in the builder's tool-call syntax (what a rollout shows
    of a past call: :meth:`~slea.policy.tool_calls.ToolParser.format`) and ``action`` what the rollout's parser
    reads back from that text (the canonical JSON the env steps on; None when it reads no call)."""
    try:
        calls = json.loads(calls_json)
    except ValueError:
        return calls_json, None
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not calls:
        return calls_json, None
    parser = builder.tool_syntax()[0]
    text = parser.format(calls)
    parsed, _ = parser.parse(text)
    return text, json.dumps(parsed) if parsed else None


def prompt_settings(builder: PromptBuilder) -> dict[str, Any]:
    """The prompt settings a trajectory was rendered with (compare with a run's ``rollout`` section)."""
    return {"history": builder.history, "obs_max_chars": builder.obs_max_chars, "one_shot": builder.one_shot}


def sampled_trajectory(traj, env_id: str, split: str, builder: PromptBuilder,
                       env_kwargs: dict[str, Any] | None = None) -> EpisodeRecord:
    """A rollout's trajectory (``slea.types.Trajectory`` from a collector made with ``keep_messages=True``) as
    alignment data, source ``sampled``: each turn keeps its prompt messages, the model's text and its exact
    response ids."""
    turns = []
    for step in traj.steps:
        if "messages" not in step.info:
            raise ValueError("sampled trajectories need the prompt messages: RolloutCollector(keep_messages=True)")
        turns.append(Turn(step.info["messages"], step.response_text, response_ids=list(step.response_ids)))
    return EpisodeRecord(env=env_id, task=task_id(split, traj.seed), split=split, seed=int(traj.seed),
                      source="sampled", success=bool(traj.won), ret=float(traj.episode_return), turns=turns,
                      goal=traj.goal, task_type=traj.task_type, env_kwargs=dict(env_kwargs or {}),
                      prompt=prompt_settings(builder), final_info=dict(traj.final_info))


def expert_trajectories(env_id: str, env_kwargs: dict[str, Any], seeds: list[int], builder: PromptBuilder, *,
                        max_steps: int | None = None, fuzzy_cutoff: float = 0.75
                        ) -> tuple[list[EpisodeRecord], Counter[str]]:
    """Expert trajectories of the tasks ``seeds`` (one env, reset with each seed in turn) and the count of
    dropped replays by reason. ``env_kwargs`` (``split`` included) build the env; the trajectories record the
    env's own name of its split (``env.split``: ``dev`` for ScienceWorld's ``seen``)."""
    if expert_source(env_id) is None:
        raise ValueError(f"{env_id} has no expert source")
    kept: list[EpisodeRecord] = []
    dropped: Counter[str] = Counter()
    env = make(env_id, **env_kwargs)
    try:
        for seed in seeds:
            traj, why = replay_expert(env, env_id, seed, builder, split=str(getattr(env, "split", "")),
                                      max_steps=max_steps, fuzzy_cutoff=fuzzy_cutoff, env_kwargs=env_kwargs)
            if traj is None:
                dropped[why] += 1
            else:
                kept.append(traj)
    finally:
        env.close()
    return kept, dropped


# -- demonstrations: a user's scripted plays of a tool env ------------------------------------------------------
Calls = list[dict[str, Any]]  # one turn's calls, canonical: [{"name": ..., "arguments": {...}}]


class DemonstrationFailed(Exception):
    """A demonstration that is not kept; the message says why (a refused call, not won, ...)."""


@dataclass(frozen=True)
class Demonstration:
    """A scripted play of one task: the env seed that picks the task, and the calls of each turn in order."""

    seed: int
    turns: list[Calls]


def parse_demonstrations(rows: Any) -> list[Demonstration]:
    """Demonstrations from JSON: a list of ``{"seed": int, "calls": [...]}``, each element of ``calls`` one turn:
    a call ``{"name": str, "arguments": {...}}``, or a list of calls made in one turn. A malformed one raises
    ``ValueError`` naming its index, anything but a list ``TypeError`` (the calls themselves are checked by the
    env when they are played)."""
    if not isinstance(rows, list):
        raise TypeError(f"expected a JSON list of demonstrations, got {type(rows).__name__}")
    out = []
    for k, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != {"seed", "calls"}:
            raise ValueError(f"demonstration {k}: expected {{'seed': int, 'calls': [...]}}")
        seed, turns = row["seed"], row["calls"]
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"demonstration {k}: seed must be an integer >= 0, got {seed!r}")
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"demonstration {k}: calls must be a non-empty list")
        calls = [t if isinstance(t, list) else [t] for t in turns]
        if any(not c or not all(isinstance(x, dict) and isinstance(x.get("name"), str)
                                and isinstance(x.get("arguments", {}), dict) for x in c) for c in calls):
            raise ValueError(f"demonstration {k}: every call is an object with a 'name' and 'arguments'")
        out.append(Demonstration(seed, calls))
    return out


def load_demonstrations(path: str | Path) -> list[Demonstration]:
    """:func:`parse_demonstrations` of a JSON file; a bad file raises ``ValueError`` naming it."""
    path = Path(path)
    try:
        return parse_demonstrations(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"{path}: {exc}") from None


class ScriptedPlay:
    """One scripted episode of a tool env, as a rollout would play it: each turn is rendered from the rollout's
    state (:class:`AgentView`, ``builder``) before the calls are made, the calls are written in the builder's
    tool-call syntax and read back by the rollout's parser (:func:`tool_answer`), and the env steps on what was
    read. Called, ``call(tool, **arguments)`` makes one call in a turn of its own and returns the tool's result
    (the observation); :meth:`turn` makes several calls in one turn. A refused call, a failing tool, a call after
    the end or past ``max_steps`` raises :class:`DemonstrationFailed` and marks the episode failed (``failed``:
    why), so a play function that catches the exception and goes on is still dropped."""

    def __init__(self, env, seed: int, builder: PromptBuilder, max_steps: int | None = None) -> None:
        self.env, self.seed, self.builder, self.max_steps = env, int(seed), builder, max_steps
        obs, info = env.reset(seed=seed)
        self.view = AgentView.start(obs, info)
        self.info = info
        self.turns: list[Turn] = []
        self.ret, self.done, self.failed = 0.0, False, ""

    def task(self) -> dict[str, Any]:
        """What the play function is given: the task dict a :class:`~slea.envs.tools.ToolEnv` picks for the seed
        (``tasks[seed % len(tasks)]``, as its reset does), or ``{"goal": ...}`` for another tool env."""
        tasks = getattr(self.env, "tasks", None)
        if not isinstance(tasks, list) or not tasks:
            return {"goal": self.view.goal}
        task = dict(tasks[self.seed % len(tasks)])
        if str(task.get("goal", "")) != self.view.goal:  # a subclass that picks its tasks otherwise
            return {"goal": self.view.goal}
        return task

    def __call__(self, tool: str, /, **arguments: Any) -> str:
        return self.turn([{"name": tool, "arguments": arguments}])

    def turn(self, calls: Calls) -> str:
        """One turn making ``calls`` in order; the result (several calls: a JSON array of results)."""
        if self.failed:
            self._fail(self.failed)
        if self.done:
            self._fail("a call after the episode ended")
        if self.max_steps is not None and len(self.turns) >= self.max_steps:
            self._fail(f"too many steps (more than {self.max_steps})")
        try:
            calls = [{"name": c["name"], "arguments": c.get("arguments", {})} for c in calls]
            text, action = tool_answer(json.dumps(calls), self.builder)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # not calls, or not JSON values
            self._fail(f"not a list of JSON calls ({type(exc).__name__}: {exc})")
        if action is None:
            self._fail(f"the rollout's parser reads no call in {text[:80]!r}")
        messages = self.view.messages(self.builder, self.env.instructions)
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info.get("fault"):
            self._fail(f"a tool failed: {info.get('error', '')}")
        if info.get("invalid"):
            self._fail(f"a call was refused: {info.get('error', '')}")
        self.view.advance(text, action, obs, info)
        self.turns.append(Turn(messages, text))
        self.info, self.ret = info, self.ret + float(reward)
        self.done = bool(terminated or truncated)
        return obs

    def _fail(self, why: str) -> NoReturn:
        self.failed = why
        raise DemonstrationFailed(why)


PlayFn = Callable[[dict[str, Any], ScriptedPlay], Any]  # play(task, call): makes the calls of one task


def calls_play(demo: Demonstration) -> PlayFn:
    """The play function of a list demonstration: its turns' calls, in order."""
    def play(task: dict[str, Any], call: ScriptedPlay) -> None:
        for calls in demo.turns:
            call.turn(calls)

    return play


def replay_demonstration(env, env_id: str, seed: int, builder: PromptBuilder, play: PlayFn, *, split: str = "",
                         max_steps: int | None = None, env_kwargs: dict[str, Any] | None = None
                         ) -> tuple[EpisodeRecord | None, str]:
    """Play ``play(task, call)`` on ``env`` reset with ``seed`` (:class:`ScriptedPlay`); ``(trajectory, "")``
    with source ``demonstration``, or ``(None, why)`` when a call is refused, a tool fails, the play goes on
    after the end or past ``max_steps``, raises, or stops before the episode ends or without a win."""
    episode = ScriptedPlay(env, seed, builder, max_steps)
    try:
        play(episode.task(), episode)
    except DemonstrationFailed as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001  (the user's play function failed on this task: dropped, with why)
        return None, episode.failed or f"the play function raised {type(exc).__name__}: {exc}"[:200]
    if episode.failed:  # the play caught the failure and went on
        return None, episode.failed
    if not episode.done:
        return None, "not finished (no final tool was called)"
    if not episode.info.get("won"):
        return None, f"not won (return {episode.ret:g})"
    return _won(env_id, split, seed, "demonstration", episode.view.goal, episode.info, episode.turns, episode.ret,
                builder, env_kwargs=env_kwargs), ""


def demonstration_trajectories(env_id: str, env_kwargs: dict[str, Any], plays: list[tuple[int, PlayFn]],
                               builder: PromptBuilder, *, max_steps: int | None = None
                               ) -> tuple[list[EpisodeRecord], list[tuple[int, str]]]:
    """The demonstrations ``plays`` (``(env seed, play function)``, :func:`calls_play` for a list of calls) replayed
    on one env built with ``env_kwargs`` (``split`` included): the won trajectories, and ``(seed, why)`` for each
    one dropped. A non-tool env raises ``ValueError`` (demonstrations are tool calls)."""
    if not getattr(env_class(env_id), "tool_env", False):
        raise ValueError("not a tool env (demonstrations are tool calls)")
    kept: list[EpisodeRecord] = []
    dropped: list[tuple[int, str]] = []
    env = make(env_id, **env_kwargs)
    try:
        for seed, play in plays:
            traj, why = replay_demonstration(env, env_id, seed, builder, play, split=str(getattr(env, "split", "")),
                                             max_steps=max_steps, env_kwargs=env_kwargs)
            if traj is None:
                dropped.append((seed, why))
            else:
                kept.append(traj)
    finally:
        env.close()
    return kept, dropped
