"""TextWorld games, generated offline from seeds and cached on disk (ids ``slea/TextWorld-v0`` and friends).

Task specs, splits, seeds and the game cache are in slea/envs/textworld_games.py (re-exported here).

Observation, info, reward
-------------------------
The observation is the engine's text with the ASCII banner, the ``>`` prompt and status line (room, score,
moves) and the end-of-game ``RESTART/RESTORE`` menu removed, so identical states give identical anchors.
The objective the engine prints at the head of the first observation is dropped (it is ``info["goal"]``;
``goal_in_observation=True`` keeps it).
``info``: ``goal`` (objective), ``admissible_actions``, ``task_type`` (the challenge), ``won``, ``lost``,
``walkthrough`` (expert commands from the initial state), ``max_score``, ``score``, ``game`` (index in the
split), ``game_seed``, ``spec``, and ``invalid`` on steps. With ``drop_meta=True`` (default) ``look``,
``inventory`` and ``examine ...`` (except ``examine cookbook``, which the cooking games need) leave both the
admissible list and the walkthrough. ``reward="win"``: 1 on a win, else 0; ``reward="score"``: the score delta
divided by ``max_score``. The episode terminates on a win or a loss.

A command outside the admissible list does not reach the engine: the env answers the previous observation,
reward 0 and ``info["invalid"] = True`` (the rollout collector applies any penalty).

Instructions (:data:`INSTRUCTIONS`): pick one command from the list of valid commands; the example is a coin
room in TextWorld's own words.

State key
---------
:meth:`TextWorldEnv.state_key` (:func:`textworld_state_key`) names the kind of state from the observation, the
goal and the admissible commands only: a room (and whether the goal names it) or the first clause of the
feedback, the exits by direction with their doors, where the goal's object is (the goal's last "take/retrieve/
recover/pick up/lift the X from the Y"), and counts of the other objects, containers and supporters; names fill
the slots (``goal object``, ``goal room``, ``goal place``, ``other object 1``, ``container 1``, ``door 1``...).

Snapshots
---------
``get_state()`` returns ``{"game": index, "game_seed": seed, "spec": spec, "actions": [...]}`` (the game and
the commands executed since reset; a small JSON-able dict); ``set_state(state)`` resets that game and replays
the commands (TextWorld games are deterministic).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slea.envs.base import StepResult, TextEnv, register, user_turn
from slea.envs.textworld_games import (  # noqa: F401  (re-exported: the public API of the family)
    CHALLENGES,
    DEFAULT_TASKS,
    GENERATION_STATS,
    MAX_GAMES_PER_SPLIT,
    SPLIT_SEED_BASE,
    TaskSpec,
    _is_complete,
    default_cache_dir,
    ensure_game,
    ensure_games,
    game_path,
    game_seed,
    parse_task_spec,
    prepare_games,
    split_games,
)
from slea.types import Instructions, StateKey

# ------------------------------------------------------------------------------------------------------
# Observation cleaning
# ------------------------------------------------------------------------------------------------------
_BANNER_LINE = re.compile(r"^[ \t_|\\/$<>]*$")  # the TEXTWORLD ASCII banner (and blank lines)
_PROMPT_LINE = re.compile(r"^[ \t]*>.*$", re.MULTILINE)  # "> <padding> -= Room =-1/4": prompt + status line
_END_MENU = re.compile(r"^.*Would you like to RESTART, RESTORE.*$", re.MULTILINE)
_TURNS = re.compile(r", in \d+ turns?\.")


def clean_observation(text: str) -> str:
    """Strip the banner, prompt/status lines and the end menu; normalise blank lines and trailing spaces."""
    lines = (text or "").splitlines()
    i = 0
    while i < len(lines) and _BANNER_LINE.match(lines[i]):
        i += 1
    body = "\n".join(lines[i:])
    body = _PROMPT_LINE.sub("", body)
    body = _END_MENU.sub("", body)
    body = _TURNS.sub(".", body)
    body = "\n".join(_unindent(line) for line in body.splitlines())
    body = re.sub(r"\n{3,}", "\n\n", body)
    return body.strip()


def _unindent(line: str) -> str:
    """Drop trailing spaces, and the centring indentation of lines like ``*** The End ***``."""
    line = line.rstrip()
    return line.lstrip() if len(line) - len(line.lstrip()) > 8 else line


def _is_meta(command: str) -> bool:
    if command in ("look", "inventory", "l", "i"):
        return True
    return command.startswith("examine ") and command != "examine cookbook"


def normalize_command(action: str) -> str:
    """Lower-case, collapse spaces, drop surrounding quotes/backticks and a trailing period."""
    cmd = " ".join(str(action).lower().split())
    cmd = cmd.strip("\"'`")
    cmd = cmd.rstrip(".!").strip()
    return cmd


INSTRUCTIONS = Instructions(
    system="You are playing a text adventure game. Reply with exactly one command copied from the list of "
    "valid commands, and nothing else.",
    example=((user_turn(
        "Your objective is to retrieve the coin from the floor of the pantry.",
        "-= Pantry =-\nYou've entered a pantry. There is an exit to the west.\n\nThere is a coin on the floor.",
        ["go west", "take coin"]), "take coin"),),
)


# ------------------------------------------------------------------------------------------------------
# State keys (SLEA-RL's structurally equivalent states)
# ------------------------------------------------------------------------------------------------------
_HEADER = re.compile(r"^-= (.+?) =-$", re.MULTILINE)
DIRECTIONS = ("north", "south", "east", "west")
# a sentence of TextWorld's exit grammar has one of these words ("You need an unblocked exit? You should try going
# east."): a direction elsewhere in the room text is not an exit
_EXIT_WORDS = re.compile(r"\b(?:exits?|going|go|leading|leads?|leave|doors?|entranceway)\b", re.IGNORECASE)
_DOOR_SENTENCE = re.compile(r"\bThere is (an open|a closed|a locked) (.+?) leading (north|south|east|west)\b")
# the door nouns of TextWorld's object grammar: an openable named like this is a door, not a container
DOOR_NOUNS = frozenset({"door", "portal", "gate", "passageway", "gateway", "hatch"})
# the goal's last taking instruction, "retrieve the coin from the floor of the attic", "recover the keycard from
# the rack" (TextWorld's instruction grammar: take/retrieve/recover/pick up/pick-up/lift)
_GOAL_TAKE = re.compile(
    r"\b(?:take|retrieve|recover|pick up|pick-up|lift)\s+the\s+(.+?)\s+(?:from|in|that's in)\s+the\s+"
    r"(floor of the\s+)?(.+?)(?=[.,!;]|\s+(?:and|within|inside)\b|$)",
    re.IGNORECASE,
)
_COMMANDS = (  # (pattern, what each group names): TextWorld's admissible commands, read for who is where
    (re.compile(r"^take (.+) from (.+)$"), ("held", "holder")),
    (re.compile(r"^take (.+)$"), ("floor",)),
    (re.compile(r"^put (.+) on (.+)$"), ("carried", "supporter")),
    (re.compile(r"^insert (.+) into (.+)$"), ("carried", "container")),
    (re.compile(r"^unlock (.+) with (.+)$"), ("locked", "carried")),
    (re.compile(r"^lock (.+) with (.+)$"), ("closed", "carried")),
    (re.compile(r"^(?:drop|eat|drink) (.+)$"), ("carried",)),
    (re.compile(r"^open (.+)$"), ("closed",)),
    (re.compile(r"^close (.+)$"), ("open",)),
)
_READ_VERBS = frozenset({"go", "take", "put", "insert", "unlock", "lock", "drop", "eat", "drink", "open", "close"})
_ROLE_WORDS = {  # role -> how the key's text writes an entity of that role
    "goal object": "the goal's object", "goal place": "the goal's place", "other object": "another object",
    "carried object": "a carried object", "door": "a door", "container": "a container", "supporter": "a supporter",
}


@dataclass
class _Scene:
    """Who is where, as the commands and the room text show it (names lower-case)."""

    floor: list[str] = field(default_factory=list)  # portable objects on the floor
    held: dict[str, str] = field(default_factory=dict)  # portable object -> what it is on or in
    carried: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)  # fixture -> "container" | "supporter" | "door" | ""
    state: dict[str, str] = field(default_factory=dict)  # openable -> "closed" | "open" | "locked"
    passable: list[str] = field(default_factory=list)  # directions a ``go`` command takes
    verbs: set[str] = field(default_factory=set)  # first words of the commands
    door_dirs: dict[str, str] = field(default_factory=dict)  # door -> the exit it stands in (room text)


def _read_commands(commands: Sequence[str]) -> _Scene:
    scene = _Scene()
    for cmd in (" ".join(c.lower().split()) for c in commands):
        if cmd.startswith("go ") and cmd[3:] in DIRECTIONS:
            scene.passable.append(cmd[3:])
        scene.verbs.add(cmd.split(" ", 1)[0])
        match = next((m for m in (p.match(cmd) for p, _ in _COMMANDS) if m), None)
        if match is None:
            continue
        roles = next(r for p, r in _COMMANDS if p is match.re)
        for role, name in zip(roles, match.groups(), strict=True):
            if role == "floor":
                scene.floor.append(name)
            elif role == "held":
                scene.held[name] = match.group(2)
            elif role == "carried":
                scene.carried.append(name)
            elif role in ("holder", "supporter", "container"):
                scene.kinds[name] = role if role != "holder" else scene.kinds.get(name, "")
            else:  # closed / open / locked: an openable
                scene.state[name] = "locked" if "locked" in (role, scene.state.get(name)) else role
                scene.kinds.setdefault(name, "")
    return scene


def _read_room(body: str, scene: _Scene) -> list[str]:
    """The exits a room's text names, in :data:`DIRECTIONS` order; its doors go into ``scene``."""
    for how, name, direction in _DOOR_SENTENCE.findall(body):
        name = name.lower()
        scene.door_dirs[name], scene.kinds[name] = direction, "door"
        scene.state.setdefault(name, how.split()[-1])
    said = " ".join(s for s in re.split(r"(?<=[.?!])\s+", body) if _EXIT_WORDS.search(s))
    return [d for d in DIRECTIONS if re.search(rf"\b{d}\b", said)]


def _goal_target(goal: str) -> tuple[str, str, bool]:
    """The goal's object, where the goal says it is, and whether that place is a room (``from the floor of
    the ...``); empty strings when the goal names no object to take (cooking's recipe goal)."""
    found = _GOAL_TAKE.findall(goal or "")
    if not found:
        return "", "", False
    name, floor, place = found[-1]
    return name.strip().lower(), place.strip().lower(), bool(floor)


def textworld_state_key(observation: str, goal: str, commands: Sequence[str] | None) -> StateKey:
    """The structural key of a TextWorld observation, from what the agent sees: the observation, the goal
    and the admissible commands (:meth:`TextWorldEnv.state_key`; the module docstring's "State key").

    Kept: what the observation is (a room, and whether the goal names it; or the first clause of the feedback
    to the last command, its entities written as roles, and whether the game is over); the exits by direction,
    with the state of a door that stands in one; where the goal's object is (on the floor, in or on what,
    carried, not in view); how many other objects are in view and carried; the closed, locked and open
    containers and the supporters the commands name; verbs beyond moving, taking, putting and opening.
    Dropped: room and entity names (they fill the slots), filler sentences, fixtures no command acts on, the
    score line. Example: ``a room (the goal's room) | exits east, north, south | the goal's object on the floor
    | 1 other object``, slots ``{"goal object": "fly larva", "other object 1": "stapler", "goal room":
    "studio"}``.
    """
    text = observation or ""
    low = text.lower()
    scene = _read_commands(commands or [])
    goal_object, goal_place, place_is_room = _goal_target(goal)
    header = _HEADER.search(text)
    exits = _read_room(text[header.end():], scene) if header else [d for d in DIRECTIONS if d in scene.passable]
    for name, kind in list(scene.kinds.items()):
        if not kind:  # a holder or an openable no command typed: an openable is a container unless door-named
            door = name.split()[-1] in DOOR_NOUNS and name not in scene.held.values()
            scene.kinds[name] = "supporter" if name not in scene.state else "door" if door else "container"

    # roles: the goal's object and place, then the rest numbered (containers by state), in order of mention
    def seen(name: str) -> tuple[int, str]:
        match = re.search(rf"\b{re.escape(name)}\b", low)
        return (match.start() if match else len(low)), name

    slots: dict[str, str] = {}
    if goal_object:
        slots["goal object"] = goal_object
    if goal_place and not place_is_room and goal_place in scene.kinds:
        slots["goal place"] = goal_place
    in_view = [n for n in dict.fromkeys([*scene.floor, *scene.held]) if n != goal_object]
    fixtures = {k: sorted((n for n, kind in scene.kinds.items() if kind == k and n not in slots.values()), key=seen)
                for k in ("door", "container", "supporter")}
    groups = {
        "other object": sorted(in_view, key=seen),
        "carried object": sorted({n for n in scene.carried if n != goal_object and n not in in_view}, key=seen),
        "door": sorted(fixtures["door"], key=lambda n: DIRECTIONS.index(scene.door_dirs.get(n, "north"))
                       + 4 * (n not in scene.door_dirs)),
        "container": sorted(fixtures["container"], key=lambda n: _state_word(scene, n)),
        "supporter": fixtures["supporter"],
    }
    role_of = {name: _ROLE_WORDS[role] for role, name in slots.items()}
    for group, names in groups.items():
        for i, name in enumerate(names, 1):
            role_of.setdefault(name, _ROLE_WORDS[group])
            slots[f"{group} {i}"] = name

    if header:
        parts = ["a room"]
        if place_is_room and header.group(1).strip().lower() == goal_place:
            parts, slots["goal room"] = ["a room (the goal's room)"], goal_place
    else:
        parts = ["after: " + _feedback_template(text, role_of)]
        if "*** the end ***" in low or "*** you lost! ***" in low:
            parts.append("the game is over: " + ("lost" if "you lost!" in low else "won"))
            return _key(parts, slots)
    door_at = {d: n for n, d in scene.door_dirs.items()}
    shown = [f"{d} ({scene.state.get(door_at[d], 'closed')} door)" if d in door_at else d for d in exits]
    parts.append("exits " + ", ".join(shown) if shown else "no exits")
    parts += [_a(f"{scene.state.get(n, 'closed')} door") for n in groups["door"] if n not in scene.door_dirs]
    if goal_object:
        parts.append("the goal's object " + _where(goal_object, scene, slots.get("goal place", "")))
        if "goal place" in slots:
            parts.append("the goal's place: " + _a(_state_word(scene, goal_place) + scene.kinds[goal_place]))
    if groups["other object"]:
        parts.append(_count(len(groups["other object"]), "other object"))
    if groups["carried object"]:
        parts.append("carrying " + _count(len(groups["carried object"]), "other object"))
    states = [_state_word(scene, n) for n in groups["container"]]
    parts += [_count(states.count(word), f"{word}container") for word in sorted(set(states))]
    if groups["supporter"]:
        parts.append(_count(len(groups["supporter"]), "supporter"))
    if scene.verbs - _READ_VERBS:
        parts.append("can also " + ", ".join(sorted(scene.verbs - _READ_VERBS)))
    return _key(parts, slots)


def _where(name: str, scene: _Scene, goal_place: str) -> str:
    """Where the goal's object is: on the floor, in/on the goal's place, a container or a supporter, carried,
    or not in view."""
    if name in scene.floor:
        return "on the floor"
    if name in scene.held:
        holder = scene.held[name]
        inside = "in" if scene.kinds.get(holder) == "container" else "on"
        if holder == goal_place:
            return f"{inside} the goal's place"
        return f"{inside} a container" if inside == "in" else "on a supporter"
    return "carried" if name in scene.carried else "not in view"


def _key(parts: list[str], slots: dict[str, str]) -> StateKey:
    """The key of ``parts``, with the slots of the roles its text speaks of (``other object 2`` is spoken of by
    "2 other objects", ``carried object 1`` by "carrying ...")."""
    text = " | ".join(parts)
    said = {"goal object": "the goal's object", "goal place": "the goal's place", "goal room": "the goal's room",
            "carried object": "carr"}
    return StateKey(text, {role: name for role, name in slots.items()
                           if said.get(role.rstrip("0123456789 "), role.rstrip("0123456789 ")) in text})


def _a(words: str) -> str:
    return ("an " if words[:1] in "aeiou" else "a ") + words


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("s" if n != 1 else "")


def _state_word(scene: _Scene, name: str) -> str:
    """``"closed "`` / ``"open "`` / ``"locked "`` for an openable, ``""`` for a supporter."""
    return f"{scene.state[name]} " if scene.kinds.get(name) != "supporter" and name in scene.state else ""


def _feedback_template(text: str, role_of: dict[str, str]) -> str:
    """The first clause of a feedback observation (up to its first ``.,:;!?``), lower-cased, quoted titles
    written as ``a text``, every known entity (longest names first, with its article) written as its role,
    numbers as ``#``."""
    line = re.sub(r'"[^"]*"', "a text", (text.strip().splitlines() or [""])[0].lower())
    line = re.split(r"[.,:;!?]", line, maxsplit=1)[0]
    for name in sorted(role_of, key=lambda n: (-len(n), n)):
        line = re.sub(rf"\b(?:(?:a|an|the|some)\s+)?{re.escape(name)}\b", role_of[name], line)
    return re.sub(r"\d+", "#", " ".join(line.split()))


# ------------------------------------------------------------------------------------------------------
# The environment
# ------------------------------------------------------------------------------------------------------
class TextWorldEnv(TextEnv):
    """A TextWorld task set as a slea text env (see the module docstring for specs, splits, info, reward).

    Args:
        tasks: task specs (``"coin_collector:1"``...); game ``i`` uses ``tasks[i % len(tasks)]``.
        split: ``"train"`` (seeds 1000+) or ``"heldout"`` (seeds 5000+).
        num_games: games in the split; ``reset(seed=k)`` plays game ``k % num_games``.
        cache_dir: game cache (default ``$SLEA_CACHE_DIR/textworld`` or ``~/.cache/slea/textworld``).
        reward: ``"win"`` (1 on a win) or ``"score"`` (score delta / max score).
        drop_meta: hide ``look``, ``inventory`` and ``examine ...`` (not ``examine cookbook``).
        prepare: when to generate missing games: ``"on_miss"`` (default: the first reset that needs a missing
            game generates every missing game of the split, in one child process), ``True``/``"all"`` (in
            the constructor), ``False``/``"lazy"`` (only the game a reset needs).
        game_files: play these compiled games instead of generated ones (tasks/split are then ignored).
        goal_in_observation: keep the objective at the head of the first observation, as the engine prints
            it. Off by default: the goal is ``info["goal"]`` and the prompt shows it once already; repeated,
            it costs ~80 prompt tokens per step and pushes the room's exits past the observation clip.
    """

    snapshots = "replay"  # get_state/set_state: reset the game, replay its commands

    def __init__(
        self,
        tasks: Sequence[str] = DEFAULT_TASKS,
        split: str = "train",
        num_games: int = 16,
        cache_dir: str | Path | None = None,
        reward: str = "win",
        drop_meta: bool = True,
        prepare: bool | str = "on_miss",
        game_files: Sequence[str | Path] | None = None,
        goal_in_observation: bool = False,
    ) -> None:
        super().__init__()
        if reward not in ("win", "score"):
            raise ValueError(f"reward must be 'win' or 'score', got {reward!r}")
        if isinstance(tasks, str):
            tasks = [tasks]
        self.split = split
        self.reward_mode = reward
        self.drop_meta = drop_meta
        self.goal_in_observation = goal_in_observation
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self._files: list[Path] | None = None
        if game_files is not None:
            self._files = [Path(f) for f in game_files]
            if not self._files:
                raise ValueError("game_files is empty")
            self._games: list[tuple[TaskSpec | None, int | None]] = [(None, None)] * len(self._files)
        else:
            self._games = list(split_games(tasks, split, num_games))
        self.num_games = len(self._games)
        self._paths: dict[int, Path] = {}  # games known to be in the cache
        modes = {True: "all", False: "lazy", "all": "all", "lazy": "lazy", "on_miss": "on_miss"}
        if prepare not in modes:
            raise ValueError(f"prepare must be one of 'on_miss', 'all', 'lazy' (or a bool), got {prepare!r}")
        self.prepare = modes[prepare]
        if self.prepare == "all" and self._files is None:
            ensure_games(self._games, self.cache_dir)  # type: ignore[arg-type]
        self._tw: Any = None  # the textworld environment, reused across resets
        self._loaded: Path | None = None
        self._game_index = -1
        self._actions: list[str] = []
        self._score = 0.0
        self._max_score = 0.0
        self._walkthrough: list[str] = []
        self._won = False
        self._lost = False
        self._done = False
        self.task_type = "textworld"

    # -- games -----------------------------------------------------------------------------------------
    def game_file(self, index: int) -> Path:
        """The compiled game file of game ``index`` (generated on first use)."""
        if self._files is not None:
            return self._files[index]
        spec, seed = self._games[index]
        assert spec is not None and seed is not None
        if index in self._paths:
            return self._paths[index]
        path = game_path(spec, seed, self.cache_dir)
        if not _is_complete(path) and self.prepare == "on_miss":
            ensure_games(self._games, self.cache_dir)  # type: ignore[arg-type]
        self._paths[index] = ensure_game(spec, seed, self.cache_dir)
        return self._paths[index]

    def game_info(self, index: int) -> dict[str, Any]:
        spec, seed = self._games[index]
        return {"game": index, "game_seed": seed, "spec": spec.canonical if spec else str(self._files[index])}

    def _load(self, path: Path) -> None:
        import textworld

        if self._tw is not None and self._loaded == path:
            return
        infos = textworld.EnvInfos(
            admissible_commands=True,
            won=True,
            lost=True,
            objective=True,
            score=True,
            max_score=True,
            extras=["walkthrough"],
        )
        with warnings.catch_warnings():
            # jericho cannot track score/moves in TextWorld's .z8 files; TextWorld tracks them itself.
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            if self._tw is None:
                self._tw = textworld.start(str(path), request_infos=infos)
            else:
                self._tw.load(str(path))
        self._loaded = path

    # -- the contract ------------------------------------------------------------------------------------
    instructions = INSTRUCTIONS
    expert_source = "walkthrough"  # info["walkthrough"]: the game's walkthrough

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = self._pick(self.num_games, seed, options)
        self._load(self.game_file(index))
        gs = self._tw.reset()
        spec = self._games[index][0]
        self._game_index = index
        self.task_type = spec.challenge if spec else "textworld"
        self._actions = []
        self._score = float(gs.get("score") or 0)
        self._max_score = float(gs.get("max_score") or 0)
        self._goal = (gs.get("objective") or "").strip()
        walkthrough = list(gs.get("extra.walkthrough") or [])
        self._walkthrough = [c for c in walkthrough if not (self.drop_meta and _is_meta(c))]
        self._won, self._lost, self._done = bool(gs.get("won")), bool(gs.get("lost")), False
        self._admissible = self._filter(gs.get("admissible_commands"))
        obs = clean_observation(gs.get("feedback") or "")
        if not self.goal_in_observation and self._goal and obs.startswith(self._goal):
            obs = obs[len(self._goal):].lstrip()
        return obs, {}

    def _filter(self, commands: Sequence[str] | None) -> list[str]:
        cmds = list(commands or [])
        if self.drop_meta:
            cmds = [c for c in cmds if not _is_meta(c)]
        return cmds

    def _step(self, action: str) -> StepResult:
        if self._game_index < 0:
            return self._reject("Call reset() before step().")
        if self._done:
            return self._reject("The episode is over; call reset().")
        cmd = normalize_command(action)
        if cmd not in (self._admissible or []):
            return self._reject("That is not a valid command here.")
        gs, score, _ = self._tw.step(cmd)
        self._actions.append(cmd)
        score = float(score or 0)
        delta = score - self._score
        self._score = score
        self._won, self._lost = bool(gs.get("won")), bool(gs.get("lost"))
        self._done = self._won or self._lost
        self._admissible = self._filter(gs.get("admissible_commands"))
        if self.reward_mode == "win":
            reward = 1.0 if self._won else 0.0
        else:
            reward = delta / self._max_score if self._max_score > 0 else 0.0
        obs = clean_observation(gs.get("feedback") or "")
        return obs, reward, self._done, False, {"invalid": False}

    def state_key(self, observation: str) -> StateKey:
        """The observation's structural key (:func:`textworld_state_key`), read from the observation, the goal
        and the admissible commands only: never the walkthrough, the score or the game's hidden state. It keeps
        the kind of observation (a room, or the feedback's first line with entities as roles), the exits with
        their doors, where the goal's object is, and the counts of other objects, containers and supporters;
        it drops names (they fill the slots) and filler. Example: ``a room | exits east, north, south | the
        goal's object on the floor | 1 other object``, slots ``{"goal object": "fly larva", "other object 1":
        "stapler"}``."""
        return textworld_state_key(observation, self._goal, self._admissible)

    def _info_defaults(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "won": self._won,
            "lost": self._lost,
            "walkthrough": list(self._walkthrough),
            "max_score": self._max_score,
            "score": self._score,
        }
        if self._game_index >= 0:
            info.update(self.game_info(self._game_index))
        return info

    # -- snapshots (replay from seed) ---------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """A snapshot: the game index and the commands executed since reset (replayed by :meth:`set_state`)."""
        if self._game_index < 0:
            raise RuntimeError("get_state() before reset()")
        return {**self.game_info(self._game_index), "actions": list(self._actions)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`get_state` snapshot by resetting its game and replaying its commands.

        Only ``game`` and ``actions`` are required; ``spec``/``game_seed``, when present, must match this
        env's game of that index (a snapshot taken with another task set is refused with ``ValueError``).
        """
        index = int(state["game"])
        if not 0 <= index < self.num_games:
            raise ValueError(f"snapshot game {index} outside this env's 0..{self.num_games - 1}")
        mine = self.game_info(index)
        for key in ("spec", "game_seed"):
            if key in state and state[key] != mine[key]:
                raise ValueError(
                    f"snapshot {key}={state[key]!r} does not match this env's game {index} ({mine})"
                )
        self.reset(options={"game": index})
        for cmd in state.get("actions", []):
            _obs, _, _, _, info = self.step(cmd)
            if info.get("invalid"):
                raise RuntimeError(f"replaying {cmd!r} failed: the snapshot does not match this game")

    def render(self) -> str:
        return self._last_obs

    def close(self) -> None:
        if self._tw is not None:
            with contextlib.suppress(Exception):
                self._tw.close()
            self._tw = None
            self._loaded = None
        super().close()


# ------------------------------------------------------------------------------------------------------
# Registration (cheap: nothing of textworld is imported here)
# ------------------------------------------------------------------------------------------------------
_ENTRY = "slea.envs.textworld:TextWorldEnv"
_COMMON = {"family": "textworld", "extra": "textworld", "requires": ("textworld",)}

register(
    "slea/TextWorld-v0",
    _ENTRY,
    description="TextWorld: coin collector 1-4 + treasure hunter 1-3 (default)",
    **_COMMON,
)
register(
    "slea/TextWorld-Coin-v0",
    _ENTRY,
    description="TextWorld coin collector, levels 1-4",
    tasks=("coin_collector:1", "coin_collector:2", "coin_collector:3", "coin_collector:4"),
    **_COMMON,
)
register(
    "slea/TextWorld-Treasure-v0",
    _ENTRY,
    description="TextWorld treasure hunter, levels 1-3",
    tasks=("treasure_hunter:1", "treasure_hunter:2", "treasure_hunter:3"),
    **_COMMON,
)
register(
    "slea/TextWorld-Simple-v0",
    _ENTRY,
    description="TextWorld 'simple' house game, dense rewards",
    tasks=("simple:dense",),
    **_COMMON,
)
register(
    "slea/TextWorld-Cooking-v0",
    _ENTRY,
    description="TextWorld cooking, 1-2 ingredients, 1 room",
    tasks=("cooking:1", "cooking:2:cut,open"),
    **_COMMON,
)
