"""ALFWorld: household tasks in the ALFRED domain, played as text (ids ``slea/ALFWorld-v0`` and friends).

Games
-----
Three sources, one engine (textworld's PDDL engine + alfworld's ``AlfredDemangler`` / ``AlfredInfos`` /
``AlfredExpert``, the stack ALFWorld itself plays its ``.tw-pddl`` games with):

* ``game_files=[...]``: any ``game.tw-pddl`` files (each with its ``traj_data.json`` beside it).
* ``source="official"``: the official game set, when you have it (it is a download: ``alfworld-download``).
  Its root is ``data_path``, ``$ALFWORLD_DATA`` or ``~/.cache/alfworld`` (where ``alfworld-download`` puts
  it by default); the split folders are looked up as ``<root>/json_2.1.1/<split>``
  or ``<root>/<split>``. As ALFWorld's own loader does, games under ``movable``/``Sliced`` folders and games not
  marked solvable are skipped. Splits: ``train`` (3,553 games), ``seen`` = ``valid_seen`` (140; aliases
  ``dev``, ``eval_in_distribution``), ``unseen`` = ``valid_unseen`` (134; aliases ``heldout``, ``test``,
  ``eval_out_of_distribution``: ALFWorld's out-of-distribution set; GiGPO evaluates on a 120-game sample
  of the six categories, with 50 steps per episode).
* ``source="generated"``: games made offline by :mod:`slea.envs.alfworld_gen` (no download), cached under
  ``cache_dir`` (default ``$SLEA_CACHE_DIR/alfworld`` or ``~/.cache/slea/alfworld``) as
  ``v<GEN_VERSION>/<task type>/seed-<seed>/{game.tw-pddl,traj_data.json}``. Game ``i`` of a split has task type
  ``tasks[i % len(tasks)]`` and seed ``base + i`` (train 1000+, seen 9000+, heldout/unseen 5000+; at most
  4000 games per split, so the splits never share a game). Generation is deterministic and safe under
  concurrency (file lock, build in a private folder, atomic rename).

``source="auto"`` (default) uses the official set when one of those roots holds it, else generated games.
(Importing ``alfworld`` sets ``$ALFWORLD_DATA`` to ``~/.cache/alfworld`` when unset and creates that folder.)
``tasks`` filters/chooses the task types, by short name: ``pick``, ``look``, ``clean``, ``heat``, ``cool``,
``pick_two`` (the papers' table columns), or by ALFRED name (``pick_and_place_simple``...).

``reset(seed=k)`` plays game ``k % num_games``; ``reset(options={"game": i})`` picks game ``i``.

Observation, info, reward
-------------------------
The first observation is the room and the task ("You are in the middle of a room... Your task is to: put a
clean mug in cabinet."; the "-= Welcome to TextWorld, ALFRED! =-" banner is dropped), then the engine's
feedback. Instructions (:data:`INSTRUCTIONS`): pick one command from the list of valid commands, with an
example at a countertop. ``info``: ``goal`` (the task text), ``admissible_actions`` (the engine's, sorted, without ``help``),
``task_type`` (short name), ``task`` (ALFRED task type), ``won``, ``walkthrough`` (the expert commands stored
in the game: for generated games the hand-coded expert's winning run), ``expert_action`` (the expert's next
command from the current state, with ``expert="handcoded"`` or ``"planner"``; None with ``expert=None``),
``game`` (index), ``game_file``, ``moves``, ``invalid``. Reward 1 on the winning step, else 0; the episode
terminates on a win. Episode length is the trainer's (``env.max_steps``; GiGPO's protocol: 50).

A command outside the admissible list does not reach the engine: the observation is the engine's own answer
to such commands, "Nothing happens.", with ``invalid=True``. ``put X in/on Y`` (the older ALFWorld verb that
prompts often use) is read as ``move X to Y``.

State key: :meth:`ALFWorldEnv.state_key` (:func:`alfworld_state_key`), the same for every source, names the kind of
state from the observation, the goal and the admissible commands only: the task, the first clause with entities as
roles (the goal's object and receptacle, the task's appliance or lamp, another receptacle), the receptacle's
state, whether the goal's object is in view, what is held; names fill the slots.

Snapshots: ``get_state()`` -> ``{"game", "game_file", "actions"}``; ``set_state`` resets the game and replays
the actions (the engine is deterministic).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import tempfile
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from filelock import FileLock

from slea.envs.alfworld_gen import SHORT_NAMES, TASK_TYPES  # the generator module imports no engine
from slea.envs.base import StepResult, TextEnv, register, user_turn
from slea.types import Instructions, StateKey

GEN_SPLIT_SEED_BASE = {"train": 1000, "heldout": 5000, "seen": 9000}
MAX_GAMES_PER_SPLIT = 4000
_GEN_SPLITS = {
    "train": "train",
    "heldout": "heldout",
    "unseen": "heldout",
    "test": "heldout",
    "eval_out_of_distribution": "heldout",
    "valid_unseen": "heldout",
    "seen": "seen",
    "dev": "seen",
    "valid": "seen",
    "valid_seen": "seen",
    "eval_in_distribution": "seen",
}
_OFFICIAL_SPLITS = {
    "train": "train",
    "seen": "valid_seen",
    "valid_seen": "valid_seen",
    "dev": "valid_seen",
    "eval_in_distribution": "valid_seen",
    "unseen": "valid_unseen",
    "valid_unseen": "valid_unseen",
    "heldout": "valid_unseen",
    "test": "valid_unseen",
    "eval_out_of_distribution": "valid_unseen",
}
_BANNER = re.compile(r"^\s*-= Welcome to TextWorld, ALFRED! =-\s*")
_GOAL = re.compile(r"Your task is to:\s*(.*?)\s*$", re.DOTALL)
_PUT = re.compile(r"^put (.+?) (?:in|on|in/on|into|onto) (.+)$")
NOTHING = "Nothing happens."
INSTRUCTIONS = Instructions(
    system="You are a household robot in a text world. Reply with exactly one command copied from the list of "
    "valid commands, and nothing else.",
    example=((user_turn(
        "put a mug in cabinet",
        "You arrive at countertop 1. On the countertop 1, you see a mug 1, and a spoon 2.",
        ["examine countertop 1", "go to cabinet 1", "take mug 1 from countertop 1"]),
        "take mug 1 from countertop 1"),),
)


# ------------------------------------------------------------------------------------------------------
# Task types and splits
# ------------------------------------------------------------------------------------------------------
def canonical_task(name: str) -> str:
    """The short task-type name (``pick``...) of a short or ALFRED name."""
    key = str(name).strip().lower().replace("-", "_")
    if key in TASK_TYPES:
        return key
    if key in SHORT_NAMES:
        return SHORT_NAMES[key]
    raise ValueError(f"unknown ALFWorld task type {name!r}; known: {', '.join(TASK_TYPES)}")


def resolve_tasks(tasks: str | Sequence[str] | None) -> list[str]:
    if tasks is None:
        return list(TASK_TYPES)
    if isinstance(tasks, str):
        tasks = [tasks]
    names = list(dict.fromkeys(canonical_task(t) for t in tasks))
    if not names:
        raise ValueError("tasks must name at least one task type")
    return names


def task_type_of(game_file: str | Path) -> str:
    """Short task type of a game, from its folder names (ALFWorld's layout), else its traj_data.json."""
    for part in reversed(Path(game_file).parts):
        for full, short in sorted(SHORT_NAMES.items(), key=lambda kv: -len(kv[0])):
            if part.startswith(full):
                return short
    traj = Path(game_file).with_name("traj_data.json")
    with contextlib.suppress(OSError, ValueError, KeyError):
        return SHORT_NAMES.get(json.loads(traj.read_text(encoding="utf-8"))["task_type"], "alfworld")
    return "alfworld"


def gen_split(split: str) -> str:
    key = str(split).lower()
    if key not in _GEN_SPLITS:
        raise ValueError(f"split must be one of {sorted(_GEN_SPLITS)}, got {split!r}")
    return _GEN_SPLITS[key]


def official_split(split: str) -> str:
    key = str(split).lower()
    if key not in _OFFICIAL_SPLITS:
        raise ValueError(f"split must be one of {sorted(_OFFICIAL_SPLITS)}, got {split!r}")
    return _OFFICIAL_SPLITS[key]


def split_games(tasks: str | Sequence[str] | None, split: str, num_games: int) -> list[tuple[str, int]]:
    """The (task type, seed) of every generated game of a split, in game-index order."""
    names = resolve_tasks(tasks)
    if not 1 <= num_games <= MAX_GAMES_PER_SPLIT:
        raise ValueError(f"num_games must be in 1..{MAX_GAMES_PER_SPLIT}")
    base = GEN_SPLIT_SEED_BASE[gen_split(split)]
    return [(names[i % len(names)], base + i) for i in range(num_games)]


# ------------------------------------------------------------------------------------------------------
# Official games
# ------------------------------------------------------------------------------------------------------
def official_root(data_path: str | Path | None = None) -> Path | None:
    """Where the official games are: ``data_path``, else ``$ALFWORLD_DATA``, else alfworld's default download
    folder ``~/.cache/alfworld``; the first that holds json_2.1.1 (or split) folders. None if none does."""
    if data_path is not None:
        candidates = [Path(data_path)]
    else:
        env = os.environ.get("ALFWORLD_DATA")
        candidates = ([Path(env)] if env else []) + [Path.home() / ".cache" / "alfworld"]
    for root in candidates:
        root = root.expanduser()
        for cand in (root / "json_2.1.1", root):
            if any((cand / s).is_dir() for s in ("train", "valid_seen", "valid_unseen")):
                return cand
    return None


@lru_cache(maxsize=16)
def _scan(folder: str) -> tuple[str, ...]:
    games = []
    for traj in sorted(Path(folder).rglob("traj_data.json")):
        game = traj.with_name("game.tw-pddl")
        if "movable" in str(traj.parent) or "Sliced" in str(traj.parent) or not game.is_file():
            continue
        with contextlib.suppress(OSError, ValueError):
            if json.loads(game.read_text(encoding="utf-8")).get("solvable"):
                games.append(str(game))
    return tuple(games)


def official_games(
    split: str, data_path: str | Path | None = None, tasks: str | Sequence[str] | None = None
) -> list[Path]:
    """The solvable official games of a split (sorted paths), filtered by task type."""
    root = official_root(data_path)
    if root is None:
        where = data_path or os.environ.get("ALFWORLD_DATA") or "(ALFWORLD_DATA is not set)"
        raise FileNotFoundError(
            f"no official ALFWorld games under {where}: run alfworld-download (needs network) and set "
            "ALFWORLD_DATA, or use source='generated'"
        )
    folder = root / official_split(split)
    wanted = set(resolve_tasks(tasks))
    games = [Path(g) for g in _scan(str(folder)) if task_type_of(g) in wanted]
    if not games:
        raise FileNotFoundError(f"no solvable ALFWorld games of {sorted(wanted)} under {folder}")
    return games


# ------------------------------------------------------------------------------------------------------
# Generated games: the on-disk cache
# ------------------------------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """``$SLEA_CACHE_DIR/alfworld`` if set, else ``~/.cache/slea/alfworld``."""
    root = os.environ.get("SLEA_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "slea") / "alfworld"


def game_path(task: str, seed: int, cache_dir: str | Path | None = None) -> Path:
    from slea.envs.alfworld_gen import GEN_VERSION

    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"v{GEN_VERSION}" / TASK_TYPES[canonical_task(task)] / f"seed-{int(seed)}" / "game.tw-pddl"


def _complete(game: Path) -> bool:
    return game.is_file() and game.with_name("traj_data.json").is_file()


_GEN_LOCK = threading.Lock()
_GEN_ENGINE: list[Any] = []
GENERATION_STATS: dict[str, int] = {"generated": 0, "reused": 0}


def ensure_game(task: str, seed: int, cache_dir: str | Path | None = None) -> Path:
    """The path of generated game (task, seed), generating and caching it first if needed."""
    path = game_path(task, seed, cache_dir)
    if _complete(path):
        GENERATION_STATS["reused"] += 1
        return path
    from slea.envs import alfworld_gen

    folder = path.parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _GEN_LOCK, FileLock(folder.parent / ".lock"):
        if _complete(path):  # made by another process meanwhile
            GENERATION_STATS["reused"] += 1
            return path
        if not _GEN_ENGINE:
            _GEN_ENGINE.append(alfworld_gen.make_engine("handcoded"))
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
        try:
            made, _traj = alfworld_gen.generate(canonical_task(task), int(seed), tmp, _GEN_ENGINE[0])
            if folder.exists():  # a half-made folder from a crash: replace it
                shutil.rmtree(folder)
            os.replace(made, folder)  # atomic: the folder appears with both files
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        GENERATION_STATS["generated"] += 1
    return path


def prepare_games(
    tasks: str | Sequence[str] | None = None,
    split: str = "train",
    num_games: int = 12,
    cache_dir: str | Path | None = None,
) -> list[Path]:
    """Generate (or reuse) every game of a generated split; their paths in game-index order."""
    return [ensure_game(t, s, cache_dir) for t, s in split_games(tasks, split, num_games)]


# ------------------------------------------------------------------------------------------------------
# State keys (SLEA-RL's structurally equivalent states)
# ------------------------------------------------------------------------------------------------------
# ALFWorld's goal templates (alfworld.gen.goal_library), as (pattern, task); the groups are the object type and the
# receptacle type (a look task's second name is its lamp)
_GOAL_TEMPLATES = (
    (re.compile(r"^look at (?:sliced )?(\w+) under the (\w+)"), "look"),
    (re.compile(r"^examine the (?:sliced )?(\w+) with the (\w+)"), "look"),
    (re.compile(r"^(?:put a clean (?:slice of )?|clean some (?:sliced )?)(\w+) (?:and put it )?in (\w+)"), "clean"),
    (re.compile(r"^(?:put a hot (?:slice of )?|heat some (?:sliced )?)(\w+) (?:and put it )?in (\w+)"), "heat"),
    (re.compile(r"^(?:put a cool (?:slice of )?|cool some (?:sliced )?)(\w+) (?:and put it )?in (\w+)"), "cool"),
    (re.compile(r"^(?:put|find) two (?:sliced )?(\w+) (?:and put them )?in (\w+)"), "pick two"),
    (re.compile(r"^put (?:a|an|some) (\w+) (?:in|on) (\w+)"), "pick"),
)
APPLIANCES = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}  # the receptacle a task's middle step uses
_ENTITY = re.compile(r"\b([a-z]+ \d+)\b")  # ALFWorld names every entity by type and number: "mug 1", "sinkbasin 2"
_SEE = re.compile(r"you see ([^.]*)")
_LOCATION = re.compile(r"(?:arrive at|facing|on|open|close) (?:the )?([a-z]+ \d+)")  # where an observation says it is
_ABOUT = re.compile(r"(?:nothing special about|this is a normal) ([a-z]+ \d+)")  # examining a held object
# commands that name the receptacle the agent is at (second group) and, for some, an object it holds (first)
_AT_COMMAND = re.compile(r"^(?:(?:open|close) ()|take \S+ \d+ from |move (\S+ \d+) to |\w+ (\S+ \d+) with )(\S+ \d+)$")
_ALF_WORDS = {
    "goal object": "the goal's object", "goal receptacle": "the goal's receptacle",
    "appliance": "the task's appliance", "lamp": "the task's lamp", "receptacle": "another receptacle",
    "other object": "another object", "carried object": "a carried object",
}


def alfworld_goal(goal: str) -> tuple[str, str, str]:
    """(task, object type, receptacle type) of an ALFWorld goal text (``("heat", "mug", "fridge")``; a look
    task's second name is its lamp), or empty strings for a text no template matches."""
    text = " ".join((goal or "").lower().split())
    for pattern, task in _GOAL_TEMPLATES:
        match = pattern.match(text)
        if match:
            return task, match.group(1), match.group(2)
    return "", "", ""


def _here_and_held(commands: Sequence[str], text: str) -> tuple[str, list[str], set[str]]:
    """The receptacle the agent is at, what it holds and the receptacles it can go to, read from the admissible
    commands (and, where they leave it open, the observation ``text``): ``go to R`` lists every receptacle but
    the one the agent is at; ``open``/``close``/``take from``/``move to``/``heat with`` name that one; ``examine``
    is offered for it and for each held object."""
    reachable = {c[6:] for c in commands if c.startswith("go to ")}
    here: set[str] = set()
    held: set[str] = set()
    for c in commands:
        match = _AT_COMMAND.match(c)
        if match:
            here.add(match.group(4))
            held.update(g for g in match.groups()[1:3] if g)
    examined = {c[8:] for c in commands if c.startswith("examine ")} - reachable
    if not here and len(examined) > 1:  # holding something at a receptacle that does not take it
        named = _LOCATION.findall(text) or [n for n in examined if n not in _ABOUT.findall(text)]
        here = {n for n in named if n in examined}
    elif not here:  # at an empty surface, holding nothing: "examine R" is all it offers
        here = examined
    return (sorted(here - reachable) or [""])[0], sorted(held | (examined - here)), reachable


def alfworld_state_key(observation: str, goal: str, commands: Sequence[str] | None) -> StateKey:
    """The structural key of an ALFWorld observation, from what the agent sees: the observation, the goal and
    the admissible commands (:meth:`ALFWorldEnv.state_key`).

    Kept: the task (pick, clean, heat, cool, pick two, look: the goal's template); the observation's first clause
    with every entity written as its role (the goal's object, the goal's receptacle, the task's appliance or lamp,
    another receptacle, another object, a carried object), which says where the agent is and what it just did;
    whether that receptacle is open or closed; whether it shows the goal's object (or two of them) and the task's
    lamp; what the agent holds. Dropped: entity names and numbers (they fill the slots), the other objects in view,
    the room's list of receptacles. Example: ``pick: you arrive at another receptacle | the goal's object in view |
    carrying nothing``, slots ``{"receptacle": "shelf 1", "goal object": "cd 1"}``.
    """
    text = " ".join((observation or "").lower().split())
    task, object_type, target_type = alfworld_goal(goal)
    appliance = APPLIANCES.get(task, "")
    lamp = target_type if task == "look" else ""
    cmds = [" ".join(c.lower().split()) for c in (commands or [])]
    here, held, reachable = _here_and_held(cmds, text)
    middle = text.startswith("you are in the middle of a room")
    shown = [n for listing in _SEE.findall(text) for n in _ENTITY.findall(listing)]

    def role(name: str) -> str:
        kind = name.rsplit(" ", 1)[0]
        if kind == object_type:
            return "goal object"
        if name in held:
            return "carried object"
        if kind == lamp:
            return "lamp"
        if name == here or name in reachable:
            return "goal receptacle" if kind == target_type and task != "look" else (
                "appliance" if kind == appliance else "receptacle")
        return "other object"

    slots: dict[str, str] = {}
    role_of: dict[str, str] = {}
    for name in dict.fromkeys([*_ENTITY.findall(text), *held]):
        kind = role(name)
        n = sum(1 for r in slots if r.rstrip(" 0123456789") == kind) + 1
        if middle and (kind == "receptacle" or n > 1):
            continue  # the room's list of receptacles: only the first the task names get a role
        slots[kind if n == 1 and kind != "other object" else f"{kind} {n}"] = name
        role_of[name] = _ALF_WORDS[kind]

    first = re.split(r"[.,:](?:\s|$)", text, maxsplit=1)[0]
    for name in sorted(role_of, key=lambda n: (-len(n), n)):
        first = re.sub(rf"\b(?:(?:a|an|the)\s+)?{re.escape(name)}\b", role_of[name], first)
    parts = [f"{task or 'a task'}: {first}"]
    if middle:
        named = [_ALF_WORDS[r] for r in ("goal receptacle", "appliance", "lamp") if r in slots]
        parts += [" and ".join(named) + " in view"] if named else []
    else:
        parts += [s for s in ("closed", "open") if f" is {s}" in text][:1]
        goals = sum(role(n) == "goal object" for n in shown)
        if goals:
            parts.append("the goal's object in view" if goals == 1 else f"{goals} of the goal's objects in view")
        elif _SEE.search(text):
            parts.append("the goal's object not in view")
        if any(role(n) == "lamp" for n in shown):
            parts.append("the task's lamp in view")
    if commands is not None:
        parts.append("carrying " + (" and ".join(_ALF_WORDS[role(n)] for n in held) if held else "nothing"))
    key = " | ".join(parts)
    said = {r: w.removeprefix("the ").removeprefix("a ") for r, w in _ALF_WORDS.items()} | {"other object": "other object"}
    return StateKey(key, {r: n for r, n in slots.items() if said[r.rstrip(" 0123456789")] in key})


# ------------------------------------------------------------------------------------------------------
# The environment
# ------------------------------------------------------------------------------------------------------
def normalize_command(action: str) -> str:
    """Lower-case, collapse spaces, drop surrounding quotes and a trailing period."""
    cmd = " ".join(str(action).lower().split()).strip("\"'`")
    return cmd.rstrip(".!").strip()


class ALFWorldEnv(TextEnv):
    """ALFWorld games as a slea text env (see the module docstring for sources, splits, info and reward).

    Args:
        tasks: task types (short or ALFRED names); default all six.
        split: ``train``; ``seen`` / ``unseen`` (official ``valid_seen`` / ``valid_unseen``); ``heldout``
            (= ``unseen``). Generated games have the same three, from disjoint seed ranges.
        source: ``"auto"``, ``"official"`` or ``"generated"``.
        data_path: root of the official games (default ``$ALFWORLD_DATA``).
        num_games: generated games in the split (default 12); for official games, keep the first
            ``num_games`` (default all).
        cache_dir: generated-game cache (default ``$SLEA_CACHE_DIR/alfworld`` or ``~/.cache/slea/alfworld``).
        prepare: generate a generated split's games in the constructor (``True``) or when first played.
        expert: ``"handcoded"``, ``"planner"`` or None: which expert gives ``info["expert_action"]``.
        game_files: play these ``.tw-pddl`` files (everything above except ``expert`` is ignored).
    """

    snapshots = "replay"  # get_state/set_state: reset the game, replay its commands

    def __init__(
        self,
        tasks: str | Sequence[str] | None = None,
        split: str = "train",
        source: str = "auto",
        data_path: str | Path | None = None,
        num_games: int | None = None,
        cache_dir: str | Path | None = None,
        prepare: bool = False,
        expert: str | None = "handcoded",
        game_files: Sequence[str | Path] | None = None,
    ) -> None:
        super().__init__()
        if expert not in ("handcoded", "planner", None):
            raise ValueError(f"expert must be 'handcoded', 'planner' or None, got {expert!r}")
        if source not in ("auto", "official", "generated"):
            raise ValueError(f"source must be 'auto', 'official' or 'generated', got {source!r}")
        self.tasks = resolve_tasks(tasks)
        self.expert = expert
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self._gen: list[tuple[str, int]] | None = None
        self._files: list[Path] | None = None
        if game_files is not None:
            self.source = "files"
            self._files = [
                Path(f) for f in ([game_files] if isinstance(game_files, (str, Path)) else game_files)
            ]
            if not self._files:
                raise ValueError("game_files is empty")
            self.split = "files"
        else:
            if source == "auto":
                source = "official" if official_root(data_path) is not None else "generated"
            self.source = source
            if source == "official":
                self.split = official_split(split)
                self._files = official_games(split, data_path, self.tasks)[:num_games]
            else:
                self.split = gen_split(split)
                self._gen = split_games(self.tasks, self.split, num_games or 12)
                if prepare:
                    self._files = [ensure_game(t, s, self.cache_dir) for t, s in self._gen]
        self.num_games = len(self._files) if self._files is not None else len(self._gen or [])
        self._engine: Any = None
        self._loaded: Path | None = None
        self._rng_state: Any = None  # the hand-coded expert's random state (it breaks ties at random)
        self._game = -1
        self._game_file: Path | None = None
        self._actions: list[str] = []
        self._walkthrough: list[str] = []
        self._expert_action: str | None = None
        self._won = False
        self._moves = 0

    # -- games -----------------------------------------------------------------------------------------
    def game_file(self, index: int) -> Path:
        """The ``game.tw-pddl`` of game ``index`` (generated on first use)."""
        if self._files is not None:
            return self._files[index]
        task, seed = self._gen[index]  # type: ignore[index]
        return ensure_game(task, seed, self.cache_dir)

    def _engine_call(self, fn: Any, *args: Any) -> Any:
        """Run an engine call with the env's own random state (for the expert) and ``sys.argv`` kept."""
        from slea.envs.alfworld_gen import engine_guard, seeded_random

        with engine_guard(), seeded_random(self._rng_state) as box:
            result = fn(*args)
        self._rng_state = box[0]
        return result

    def _read(self, state: Any) -> None:
        self._won = bool(state.get("won"))
        commands = [c for c in (state.get("admissible_commands") or []) if c != "help"]
        self._admissible = sorted(commands)
        plan = state.get("extra.expert_plan") if self.expert else None
        self._expert_action = plan[0] if plan else None

    # -- the contract ---------------------------------------------------------------------------------
    instructions = INSTRUCTIONS
    expert_source = "expert_plan"  # info["walkthrough"]: the stored expert run (hand-coded expert)

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        from slea.envs.alfworld_gen import make_engine

        index = self._pick(self.num_games, seed, options)
        path = self.game_file(index)
        if self._engine is None:
            self._engine = make_engine(self.expert)
        self._rng_state = random.Random(f"alfworld-expert:{path.parent.name}").getstate()
        if self._loaded != path:
            self._engine_call(self._engine.load, str(path))
            self._loaded = path
        state = self._engine_call(self._engine.reset)
        self._game, self._game_file = index, path
        self.task_type = task_type_of(path)
        self._actions, self._moves = [], 0
        self._walkthrough = [str(c) for c in (state.get("extra.walkthrough") or [])]
        self._read(state)
        text = _BANNER.sub("", str(state.get("feedback") or "")).strip()
        match = _GOAL.search(text)
        self._goal = match.group(1).rstrip(".") if match else ""
        return text, {}

    def _step(self, action: str) -> StepResult:
        if self._game < 0:
            return self._reject("Call reset() before step().")
        if self._won:
            return self._reject("The episode is over.")
        cmd = normalize_command(action)
        admissible = self._admissible or []
        if cmd not in admissible:
            put = _PUT.match(cmd)
            if put and f"move {put.group(1)} to {put.group(2)}" in admissible:
                cmd = f"move {put.group(1)} to {put.group(2)}"
            else:
                return NOTHING, 0.0, False, False, {"invalid": True}
        state, _score, _done = self._engine_call(self._engine.step, cmd)
        self._actions.append(cmd)
        self._moves += 1
        self._read(state)
        obs = str(state.get("feedback") or "").strip()
        return obs, 1.0 if self._won else 0.0, self._won, False, {"invalid": False}

    def state_key(self, observation: str) -> StateKey:
        """The observation's structural key (:func:`alfworld_state_key`), read from the observation, the goal and
        the admissible commands only (never the walkthrough, the expert's plan or the PDDL state), the same for
        official and generated games. It keeps the task, the first clause with entities as roles (where the agent
        is, what it just did), the receptacle's open/closed state, whether the goal's object is in view and what
        is held; names fill the slots. Example: ``pick: you arrive at another receptacle | the goal's object in
        view | carrying nothing``, slots ``{"receptacle": "shelf 1", "goal object": "cd 1"}``."""
        return alfworld_state_key(observation, self._goal, self._admissible)

    def _info_defaults(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "won": self._won,
            "walkthrough": list(self._walkthrough),
            "expert_action": self._expert_action,
            "task": TASK_TYPES.get(self.task_type, self.task_type),
            "moves": self._moves,
        }
        if self._game >= 0:
            info.update(game=self._game, game_file=str(self._game_file))
        return info

    # -- snapshots (replay) -------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        if self._game < 0:
            raise RuntimeError("get_state() before reset()")
        return {"game": self._game, "game_file": str(self._game_file), "actions": list(self._actions)}

    def set_state(self, state: dict[str, Any]) -> None:
        index = int(state["game"])
        if not 0 <= index < self.num_games:
            raise ValueError(f"snapshot game {index} outside this env's 0..{self.num_games - 1}")
        if "game_file" in state and Path(state["game_file"]) != self.game_file(index):
            raise ValueError(f"snapshot game file {state['game_file']} is not this env's game {index}")
        self.reset(options={"game": index})
        for cmd in state.get("actions", []):
            if self.step(cmd)[4].get("invalid"):
                raise RuntimeError(f"replaying {cmd!r} failed: the snapshot does not match this game")

    def render(self) -> str:
        return self._last_obs

    def close(self) -> None:
        # The engine's planner library copy is not unloaded: dlclose-ing it (fast_downward.close_lib) makes the
        # interpreter crash at exit. Dropping the engine frees its Python state.
        self._engine = None
        self._loaded = None
        super().close()


# ------------------------------------------------------------------------------------------------------
# Registration (cheap: nothing of alfworld is imported here)
# ------------------------------------------------------------------------------------------------------
_ENTRY = "slea.envs.alfworld:ALFWorldEnv"
_COMMON = {
    "family": "alfworld",
    "extra": "alfworld",
    "requires": ("alfworld", "textworld", "fast_downward"),
}

register(
    "slea/ALFWorld-v0",
    _ENTRY,
    description="ALFWorld: official games if ALFWORLD_DATA holds them, else offline-generated ones",
    **_COMMON,
)
register(
    "slea/ALFWorld-Gen-v0",
    _ENTRY,
    description="ALFWorld: games generated offline (all six task types)",
    source="generated",
    **_COMMON,
)
register(
    "slea/ALFWorld-Official-v0",
    _ENTRY,
    description="ALFWorld: the official game set (download; path from data_path or ALFWORLD_DATA)",
    source="official",
    **_COMMON,
)
