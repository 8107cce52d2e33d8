"""The text-environment contract and the registry of environment ids.

Gymnasium style, text in and text out (as SkyRL's skyrl-gym):
``reset(seed=None, options=None) -> (observation, info)`` and
``step(action) -> (observation, reward, terminated, truncated, info)``.

``info`` always carries ``goal`` (task text), ``admissible_actions`` (list of str, or None when the action
space is open), ``task_type``, ``won``; ``step`` adds ``invalid`` (the action was not understood). The
observation returned is the raw env text: the *anchor* that step grouping and clustering use. An env never
raises on a bad action: it answers with an observation and ``invalid=True``.

Every family registers its ids here with the optional extra it needs, so ``slea envs`` can say what is
usable without importing heavy packages.

Snapshots (RTPO forks sibling rollouts from stored turn boundaries): :attr:`TextEnv.snapshots` says how a
class restores a state — ``"exact"`` (``get_state`` copies the state itself), ``"replay"`` (``set_state`` resets
the episode and replays its actions; exact for deterministic engines) or ``"none"``. A deterministic class can
opt into the base's replay fallback by setting ``snapshots = "replay"`` without writing ``get_state``: the base
records each episode's ``reset(seed, options)`` and every action sent to ``step`` and replays them.
:func:`snapshot_support` reads the attribute of a registered id without building an env.

State keys (SLEA-RL's structurally equivalent states): a family may override :meth:`TextEnv.state_key`, which gives
an observation's :class:`slea.types.StateKey` (the kind of state, entities written as their roles, and the slots that
fill those roles here); the base puts it in every info as ``state_key`` (text) and ``state_slots`` (dict). A family
without one puts nothing there, and the library keys its steps by the raw observation.

Each family also owns what the agent is told: :attr:`TextEnv.instructions` (a :class:`slea.types.Instructions`:
system prompt, example exchange, answer cue). Observations carry no instructions of their own, so clipping an
observation never cuts them.
"""

from __future__ import annotations

import importlib
import importlib.util
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym

from slea.types import Instructions, StateKey

Obs = str
SnapshotKind = Literal["exact", "replay", "none"]
StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class MissingExtraError(ImportError):
    """An env family's optional dependency is not installed; the message names the pip extra."""


# Observations and actions are free text. Gymnasium's ``Text`` space wants a charset; printable ASCII plus
# the common non-ASCII letters is enough for ``contains`` checks, which slea itself never relies on.
_TEXT_CHARSET = frozenset(string.printable) | frozenset(chr(c) for c in range(0xA0, 0x250))
TEXT_SPACE_MAX = 1 << 20


def user_turn(goal: str, observation: str, commands: list[str] | None = None, cue: str = "Your command:",
              recent: list[str] | tuple[str, ...] = (), earlier: str = "", experience: str = "") -> str:
    """The user text of one turn, the one layout of slea's prompts (the prompt builder's real turns and the
    families' example turns): ``Goal:`` (when there is one), ``Earlier actions:`` (a summary of the turns before
    the recent ones, when given), ``Recent steps:`` (when given), ``Observation:``, the ``Valid commands:`` list
    (when there is one), the retrieved experiences (when given: ``rollout.experience_in: user``) and the answer
    cue."""
    lines = [f"Goal: {goal.strip()}"] if goal.strip() else []
    if earlier:
        lines.append(f"Earlier actions: {earlier}")
    if recent:
        lines += ["Recent steps:", *recent]
    lines.append(f"Observation: {observation}")
    if commands:
        lines += ["Valid commands:", *(f"- {c}" for c in commands)]
    if experience:
        lines.append(experience)
    return "\n".join([*lines, cue])


# The default: a text game whose commands are picked from a list (what every family got before each owned its
# instructions). Families override :attr:`TextEnv.instructions`.
DEFAULT_INSTRUCTIONS = Instructions(
    system="You are an agent playing a text game. Reply with exactly one command copied from the list of valid "
    "commands, and nothing else.",
    example=((user_turn("put the apple on the table.",
                             "You are in a kitchen. There is an apple on the counter and a table.",
                             ["take apple", "go north", "open fridge"]), "take apple"),),
)


class TextEnv(gym.Env):
    """Base class of slea's text environments.

    Subclasses implement :meth:`_reset` and :meth:`_step`; the base fills the contract's ``info`` keys. A
    ``_step`` answers a bad action itself (:meth:`_reject`: an invalid step); an exception it raises is the
    engine's failure, which :meth:`step` turns into a *fault* (:meth:`_fault`: the episode ends, truncated,
    with ``info["fault"]``), never into an invalid action and never into a crash of the rollout. Subclasses may override :meth:`_info_defaults` to add family keys (``lost``,
    ``walkthrough``...) to every info, the invalid-step infos included.

    What a subclass sets (docs/howto.md, "Your own environment", builds one):

    * ``self._goal`` (str), in :meth:`_reset`: the task text. It becomes every info's ``goal`` and the prompt's
      ``Goal:`` line; an empty goal leaves that line out.
    * ``self._admissible`` (list of str, or None), in :meth:`_reset` and again in :meth:`_step` when the valid
      commands change: every info's ``admissible_actions``. A list is shown to the agent as its valid
      commands, and the rollout matches the answer to one of them (an answer that matches none is an invalid
      step that never reaches the env); ``None`` means free text that ``_step`` parses itself.
    * ``instructions`` (class attribute, :class:`slea.types.Instructions`): the family's system prompt, one
      example exchange and the answer cue. Observations carry no instructions of their own.
    * ``task_type`` (class attribute, or set per episode): groups episodes for the experience library,
      clustering and the report's tables.
    * a constructor that accepts ``split``: training envs are built with ``env.kwargs``, held-out ones with
      ``split="heldout"`` plus ``env.eval_kwargs``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    task_type: str = ""
    # What the agent is told about this env (system prompt, example exchange, answer cue): a family sets its own.
    instructions: ClassVar[Instructions] = DEFAULT_INSTRUCTIONS
    # Where the family's expert demonstrations come from (``walkthrough``, ``gold_path``, ...; None: no expert).
    # A family that names one puts its expert's actions from the initial state in the reset's
    # ``info["walkthrough"]`` (slea.alignment.data replays them to make expert trajectories).
    expert_source: ClassVar[str | None] = None
    # How get_state/set_state restore a state (module docstring); "replay" without an own get_state opts into
    # the base's replay-from-seed-and-actions fallback, which is exact only for a deterministic engine.
    snapshots: ClassVar[SnapshotKind] = "none"

    def __init__(self) -> None:
        super().__init__()
        self._goal = ""
        self._admissible: list[str] | None = None
        self._last_obs = ""
        self._episode_log: dict[str, Any] | None = None  # {"seed", "options", "actions"}: the replay fallback's
        # gymnasium.make's wrappers and the passive checker require both spaces to exist.
        self.observation_space = gym.spaces.Text(
            max_length=TEXT_SPACE_MAX, min_length=0, charset=_TEXT_CHARSET
        )
        self.action_space = gym.spaces.Text(max_length=TEXT_SPACE_MAX, min_length=0, charset=_TEXT_CHARSET)


    # -- subclass hooks -------------------------------------------------------------------------------
    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Start an episode: return ``(observation, info)`` and set ``self._goal`` and ``self._admissible``.

        ``seed`` picks the task and must pick the same one every time (slea pairs evaluations and compared runs
        by env seed; :meth:`_pick` maps ``options["game"]``, else the seed, to a task index). ``options`` is the
        reset's options dict (never None here). The observation is the raw env text, without instructions: it is
        the *anchor* that GiGPO groups on and SLEA-RL clusters. ``info`` may hold family keys; the base adds
        ``goal``, ``admissible_actions``, ``task_type`` and ``won`` (False) where it has none."""
        raise NotImplementedError

    def _step(self, action: str) -> StepResult:
        """Play one turn: return ``(observation, reward, terminated, truncated, info)``.

        ``action`` is a non-empty, stripped string (:meth:`step` refuses empty ones itself). Set
        ``info["won"] = True`` on the winning step; ``reward`` is this turn's reward (sparse tasks put the
        episode's on the last turn). Refuse an action the env cannot take with ``return self._reject(why)``: an
        invalid step, the same observation, no reward. Raise only when the engine itself fails: :meth:`step`
        turns the exception into a fault (the episode ends, the pool rebuilds the env, nothing is learned from
        it). Update ``self._admissible`` when the valid commands change."""
        raise NotImplementedError

    # -- the contract ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self._episode_log = {"seed": seed, "options": dict(options or {}), "actions": []}
        obs, info = self._reset(seed, dict(options or {}))
        self._last_obs = obs
        return obs, self._fill(info)

    def step(self, action: str) -> StepResult:
        if self._episode_log is not None:
            self._episode_log["actions"].append(action)
        if not isinstance(action, str) or not action.strip():
            return self._invalid("Empty or non-text action.")
        try:
            obs, reward, terminated, truncated, info = self._step(action.strip())
        except Exception as exc:  # noqa: BLE001  (the engine failed, not the policy: a fault, not a crash)
            return self._fault(exc)
        self._last_obs = obs
        info.setdefault("invalid", False)
        return obs, float(reward), bool(terminated), bool(truncated), self._fill(info)

    def _fault(self, exc: Exception) -> StepResult:
        """The step whose engine raised: the episode ends there (``truncated``, reward 0) with ``info["fault"]
        = "error"`` and the exception in ``info["error"]``. It is not an invalid action (the policy is not
        penalised for the engine's failure); :class:`slea.envs.pool.EnvPool` counts it as an env error, rebuilds
        the env, and the trainer does not learn from the episode."""
        info = {"invalid": False, "fault": "error", "error": f"{type(exc).__name__}: {exc}"[:500]}
        return self._last_obs, 0.0, False, True, self._fill(info)

    def _reject(self, why: str) -> StepResult:
        """What a family's ``_step`` returns for an action it refuses (no reset yet, episode over, ...):
        the same observation, no reward, ``invalid`` with the reason."""
        return self._last_obs, 0.0, False, False, {"invalid": True, "error": why}

    def _invalid(self, why: str) -> StepResult:
        """:meth:`_reject` with the info completed, for refusals made by :meth:`step` itself."""
        obs, reward, terminated, truncated, info = self._reject(why)
        return obs, reward, terminated, truncated, self._fill(info)

    def _pick(self, n: int | None, seed: int | None, options: dict[str, Any], key: str = "game") -> int:
        """Which of ``n`` tasks a reset plays: ``options[key]``, else ``seed``, modulo ``n``; else a draw from
        the env's ``np_random`` in ``[0, n)``. ``n=None`` is an unbounded generator (no modulo; the draw is in
        ``[0, 2**31 - 1)``)."""
        if options.get(key) is not None:
            index = int(options[key])
        elif seed is not None:
            index = int(seed)
        else:
            index = int(self.np_random.integers(2**31 - 1 if n is None else n))
        return index if n is None else index % n

    def state_key(self, observation: str) -> StateKey | None:
        """The structural key of ``observation``, the observation this env just returned (module docstring), or
        None: this family has none. It may read only what the agent sees — ``observation``, ``self._goal``,
        ``self._admissible``, the agent's own earlier actions — never the answer, the reward or hidden state.
        Families override it."""
        return None

    def _info_defaults(self) -> dict[str, Any]:
        """Family-specific keys every info carries (overridden by subclasses); values set by a step win."""
        return {}

    def _fill(self, info: dict[str, Any]) -> dict[str, Any]:
        for key, value in self._info_defaults().items():
            info.setdefault(key, value)
        info.setdefault("goal", self._goal)
        info.setdefault("admissible_actions", self._admissible)
        info.setdefault("task_type", self.task_type)
        info.setdefault("won", False)
        if "state_key" not in info:
            key = self.state_key(self._last_obs)
            if key is not None:
                info["state_key"], info["state_slots"] = key.text, dict(key.slots)
        return info

    # -- snapshots (RTPO forks turns from stored boundary states) ---------------------------------------
    def get_state(self) -> Any:
        """A snapshot of the episode so far. The base implements the replay fallback (``snapshots =
        "replay"``): the episode's reset seed and options and the actions sent since; families with exact or
        their own replay snapshots override it."""
        if self.snapshots != "replay":
            raise NotImplementedError(f"{type(self).__name__} has no snapshot support")
        log = self._episode_log
        if log is None:
            raise RuntimeError("get_state() before reset()")
        if log["seed"] is None:
            raise RuntimeError("the replay fallback needs an episode reset with a seed")
        return {"seed": log["seed"], "options": dict(log["options"]), "actions": list(log["actions"])}

    def set_state(self, state: Any) -> None:
        """Restore a :meth:`get_state` snapshot: the replay fallback resets with the snapshot's seed and
        options and sends its actions again (the env's rng is reseeded, so a deterministic engine ends in
        exactly the recorded state)."""
        if self.snapshots != "replay":
            raise NotImplementedError(f"{type(self).__name__} has no snapshot support")
        self.reset(seed=int(state["seed"]), options=dict(state.get("options") or {}))
        for action in state.get("actions", []):
            self.step(action)


@dataclass(frozen=True)
class EnvSpec:
    id: str
    entry_point: str  # "module:Class"
    family: str
    extra: str | None = None  # the pip extra that installs its dependencies
    requires: tuple[str, ...] = ()  # importable module names the family needs
    description: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)

    def missing(self) -> list[str]:
        """Modules this family needs that are not installed (checked without importing them)."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


_REGISTRY: dict[str, EnvSpec] = {}


def register(
    id: str,
    entry_point: str,
    *,
    family: str,
    extra: str | None = None,
    requires: tuple[str, ...] = (),
    description: str = "",
    **kwargs: Any,
) -> EnvSpec:
    """Register an env id with slea and with gymnasium (so ``gymnasium.make(id)`` works too)."""
    spec = EnvSpec(id, entry_point, family, extra, tuple(requires), description, dict(kwargs))
    _REGISTRY[id] = spec
    if id not in gym.registry:
        # Text spaces do not fit gymnasium's passive checker (it samples and type-checks numeric spaces), so
        # it is off; the TextEnv contract is tested by slea's own tests instead.
        gym.register(id=id, entry_point=_lazy_entry(spec), kwargs=dict(kwargs), disable_env_checker=True)
    return spec


def _lazy_entry(spec: EnvSpec) -> Callable[..., TextEnv]:
    def build(**kwargs: Any) -> TextEnv:
        return make(spec.id, **kwargs)

    return build


def registered() -> dict[str, EnvSpec]:
    return dict(_REGISTRY)


def snapshot_support(id: str) -> SnapshotKind:
    """How the class registered as ``id`` restores snapshots (:attr:`TextEnv.snapshots`), read without building
    an env (family modules import their engines lazily); ``"none"`` for an entry point that does not import."""
    if id not in _REGISTRY:
        raise KeyError(f"unknown env id {id!r}")
    module_name, _, cls_name = _REGISTRY[id].entry_point.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError):
        return "none"
    return getattr(cls, "snapshots", "none")


def make(id: str, **kwargs: Any) -> TextEnv:
    """Build a registered env; a missing optional dependency raises :class:`MissingExtraError`."""
    if id not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise KeyError(f"unknown env id {id!r}; registered: {known}")
    spec = _REGISTRY[id]
    missing = spec.missing()
    if missing:
        hint = f"pip install 'slea[{spec.extra}]'" if spec.extra else "install " + ", ".join(missing)
        raise MissingExtraError(f"{id} needs {', '.join(missing)}: {hint}")
    return env_class(id)(**{**spec.kwargs, **kwargs})


def env_class(id: str) -> type[TextEnv]:
    """The class a registered id builds (its module is imported; families import their engines only when an
    env is built, so this is cheap and needs no extra). Class attributes such as ``instructions`` and
    ``expert_source`` can be read without building an env."""
    if id not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise KeyError(f"unknown env id {id!r}; registered: {known}")
    module_name, _, cls_name = _REGISTRY[id].entry_point.partition(":")
    return getattr(importlib.import_module(module_name), cls_name)
