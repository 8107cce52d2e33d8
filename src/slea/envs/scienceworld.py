"""ScienceWorld: the 30 elementary-science tasks of Wang et al. (2022), id ``slea/ScienceWorld-v0``.

The engine is the ``scienceworld`` package (a Scala simulator in a bundled jar, driven over py4j; it needs Java
>= 11 on the PATH). Each env instance starts **one JVM**, lazily on its first reset, and stops it in
:meth:`ScienceWorldEnv.close`.

Tasks and splits
----------------
``tasks`` names ScienceWorld tasks by name (``"boil"``, ``"find-living-thing"``), by id (``"1-1"``, ``"4-1"``),
or by the names of ETO's data files (``"task-1-boil"``, ``"task-10-measure-melting-point-(known-substance)"``);
``None`` means all 30, ``"eto"`` the 24 tasks ETO and tlm-DRE evaluate (all but the three inclined-plane, the
two Mendelian-genetics tasks and measure-melting-point-unknown-substance).

Every task has numbered *variations* (10 to 1386), which ScienceWorld itself splits into contiguous
train / dev / test ranges (table :data:`SPLIT_SIZES`, read from the engine). ``split`` picks one range:
``"train"``; ``"dev"`` (aliases ``"heldout"``, ``"valid"``, ``"seen"``); ``"test"`` (alias ``"unseen"``). ETO
and tlm-DRE report "seen" on a sample of the dev variations (194 episodes over the 24 tasks) and "unseen" on
a sample of the test variations (211), so ``split="seen"``/``"unseen"`` with ``tasks="eto"`` is that protocol
over the full ranges; ``variations_per_task=k`` keeps the first ``k`` variations of each task (a balanced,
smaller set).

The episodes of a split interleave the tasks round-robin (variation 0 of every task, then variation 1...), so
``reset(seed=k)`` plays episode ``k % num_episodes`` and consecutive seeds cover different tasks.
``reset(options={"task": name, "variation": v})`` or ``options={"episode": i}`` picks one directly.

Observation, info, reward
-------------------------
The first observation is the engine's ``look around``; later ones are the engine's answers. The engine lists
the objects of a room in an order that changes from one load to the next, so each block of tab-indented
lines is sorted (``canonical_obs=True``): identical states give identical anchors.

``info``: ``goal`` (the task description), ``admissible_actions`` (the engine's valid action-object
combinations, sorted; 300-3,000 of them; ``max_admissible=n`` keeps ``n``, round-robin over the action verbs
so every kind of action stays represented; ``admissible=False`` skips them: much faster steps),
``task_type`` (the task name), ``won``, ``lost``, ``walkthrough`` (the engine's gold action sequence from the
initial state, when ``walkthrough=True``), ``score`` (0-100), ``raw_score`` (the engine's, -100 on a failed
task), ``max_score`` (100), ``task``, ``task_id``, ``variation``, ``episode``, ``moves``, and on steps
``invalid`` (the parser did not understand the action) and ``ambiguous``.

``reward`` is the change of ``score / 100``, so an episode's rewards sum to its final score / 100 (0 for a
failed task: the score is clipped at 0). Some initial states already earn points (the agent starts in the
room of the target box): ``info["score"]`` shows them at reset, and the first step's reward includes them. The episode terminates when the task is completed (``won``) or
failed (``lost``: e.g. focusing on the wrong object).

Instructions (:data:`INSTRUCTIONS`): the engine's action grammar (look around, open X, go to LOC, pick up X,
move X to Y, focus on X, use X on Y, wait, ...), the valid-action list as a help, and one example turn.

Actions are free text: the admissible list is a help, not a filter (spaces are collapsed and surrounding quotes
and a final period dropped, which the parser would reject). An action the parser does not know gets
the engine's answer ("No known action matches that input.") and ``invalid=True``. An ambiguous one gets the
engine's numbered choices and ``ambiguous=True``; the next action should be the chosen number (``"0"``).

Walkthroughs
------------
The gold path generator picks at random between equivalent targets (which of several animals to focus on),
so it is generated once per (task, variation, simplifications) in a process and cached: every reset of that
episode in this process reports the same walkthrough. Another process may report another, equally valid one.

State key
---------
:meth:`ScienceWorldEnv.state_key` (:func:`scienceworld_state_key`) names the kind of state from the observation
and the goal only (not the valid-action lists): a room (by name: the map is the same in every variation) and its
open doors, or the feedback's first clause with entities as roles, and whether the goal's object and boxes are in
view; what a variation changes fills the slots (``goal object``, ``goal room``, ``goal box 1``, ``object 1``...).

Snapshots
---------
``get_state()`` returns ``{"task", "variation", "simplifications", "actions"}``; ``set_state`` reloads the
variation and replays the actions (ScienceWorld is deterministic given the actions).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from slea.envs.base import MissingExtraError, StepResult, TextEnv, register, user_turn
from slea.types import Instructions, StateKey

# (task id, task name) of the 30 tasks, in the engine's ``tasks.json`` order.
TASKS: tuple[tuple[str, str], ...] = (
    ("1-1", "boil"),
    ("1-2", "melt"),
    ("1-3", "freeze"),
    ("1-4", "change-the-state-of-matter-of"),
    ("2-1", "use-thermometer"),
    ("2-2", "measure-melting-point-known-substance"),
    ("2-3", "measure-melting-point-unknown-substance"),
    ("3-1", "power-component"),
    ("3-2", "power-component-renewable-vs-nonrenewable-energy"),
    ("3-3", "test-conductivity"),
    ("3-4", "test-conductivity-of-unknown-substances"),
    ("4-1", "find-living-thing"),
    ("4-2", "find-non-living-thing"),
    ("4-3", "find-plant"),
    ("4-4", "find-animal"),
    ("5-1", "grow-plant"),
    ("5-2", "grow-fruit"),
    ("6-1", "chemistry-mix"),
    ("6-2", "chemistry-mix-paint-secondary-color"),
    ("6-3", "chemistry-mix-paint-tertiary-color"),
    ("7-1", "lifespan-longest-lived"),
    ("7-2", "lifespan-shortest-lived"),
    ("7-3", "lifespan-longest-lived-then-shortest-lived"),
    ("8-1", "identify-life-stages-1"),
    ("8-2", "identify-life-stages-2"),
    ("9-1", "inclined-plane-determine-angle"),
    ("9-2", "inclined-plane-friction-named-surfaces"),
    ("9-3", "inclined-plane-friction-unnamed-surfaces"),
    ("10-1", "mendelian-genetics-known-plant"),
    ("10-2", "mendelian-genetics-unknown-plant"),
)
TASK_NAMES: tuple[str, ...] = tuple(name for _, name in TASKS)
TASK_IDS: dict[str, str] = {name: tid for tid, name in TASKS}

# Number of (train, dev, test) variations of each task; the ranges are contiguous in that order (read from
# scienceworld 1.2.3's get_variations_train/dev/test; tests/envs/test_scienceworld.py checks a few).
SPLIT_SIZES: dict[str, tuple[int, int, int]] = {
    "boil": (14, 7, 9),
    "melt": (14, 7, 9),
    "freeze": (14, 7, 9),
    "change-the-state-of-matter-of": (14, 7, 9),
    "use-thermometer": (270, 135, 135),
    "measure-melting-point-known-substance": (218, 109, 109),
    "measure-melting-point-unknown-substance": (150, 75, 75),
    "power-component": (10, 5, 5),
    "power-component-renewable-vs-nonrenewable-energy": (10, 5, 5),
    "test-conductivity": (450, 225, 225),
    "test-conductivity-of-unknown-substances": (300, 150, 150),
    "find-living-thing": (150, 75, 75),
    "find-non-living-thing": (150, 75, 75),
    "find-plant": (150, 75, 75),
    "find-animal": (150, 75, 75),
    "grow-plant": (62, 31, 33),
    "grow-fruit": (62, 31, 33),
    "chemistry-mix": (16, 8, 8),
    "chemistry-mix-paint-secondary-color": (18, 9, 9),
    "chemistry-mix-paint-tertiary-color": (18, 9, 9),
    "lifespan-longest-lived": (62, 31, 32),
    "lifespan-shortest-lived": (62, 31, 32),
    "lifespan-longest-lived-then-shortest-lived": (62, 31, 32),
    "identify-life-stages-1": (6, 3, 5),
    "identify-life-stages-2": (4, 2, 4),
    "inclined-plane-determine-angle": (84, 42, 42),
    "inclined-plane-friction-named-surfaces": (692, 346, 348),
    "inclined-plane-friction-unnamed-surfaces": (80, 40, 42),
    "mendelian-genetics-known-plant": (60, 30, 30),
    "mendelian-genetics-unknown-plant": (240, 120, 120),
}
# The 24 tasks of ETO / tlm-DRE (their data files leave out these six).
_ETO_EXCLUDED = {
    "measure-melting-point-unknown-substance",
    "inclined-plane-determine-angle",
    "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces",
    "mendelian-genetics-known-plant",
    "mendelian-genetics-unknown-plant",
}
ETO_TASKS: tuple[str, ...] = tuple(n for n in TASK_NAMES if n not in _ETO_EXCLUDED)

SPLITS = ("train", "dev", "test")
SPLIT_ALIASES = {
    "train": "train",
    "dev": "dev",
    "heldout": "dev",
    "valid": "dev",
    "seen": "dev",
    "test": "test",
    "unseen": "test",
}
SIMPLIFICATIONS = (
    "easy",
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
)
MAX_SCORE = 100
DEFAULT_JAVA_OPTS = "-Xmx1g -XX:+UseSerialGC"

# The action grammar (the engine's ``getPossibleActions``, less its meta commands) and one example turn.
INSTRUCTIONS = Instructions(
    system="You are an agent in a science simulation. Reply with one action and nothing else. Actions: look "
    "around, look at X, look in X, open X, close X, go to LOC, pick up X, put down X, move X to Y, pour X in Y, "
    "mix X, activate X, deactivate X, connect X to Y, use X on Y, wait, focus on X (only on the task's target: "
    "a wrong focus fails the task). The valid commands listed show what is possible now. If asked which one "
    "you mean, reply with its number.",
    example=((user_turn(
        "Your task is to find a(n) animal. First, focus on the thing. Then, move it to the red box in the "
        "kitchen.",
        "This room is called the outside. In it, you see:\n\ta baby wolf\n\ta fence\nYou also see:\n"
        "\tA door to the kitchen (that is open)",
        ["focus on baby wolf", "go to kitchen", "look around", "pick up baby wolf"],
        cue="Your action:"), "focus on baby wolf"),),
    answer_cue="Your action:",
)
_UNKNOWN = ("No known action matches that input", "Unknown action")
_AMBIGUOUS = "Ambiguous request"


# ------------------------------------------------------------------------------------------------------
# Task names, splits, episodes (no engine needed)
# ------------------------------------------------------------------------------------------------------
def canonical_task(name: str) -> str:
    """The engine's name of a task given by name, id (``"4-1"``) or ETO file name (``"task-3-find-plant"``)."""
    raw = str(name).strip()
    for tid, task in TASKS:
        if raw == tid:
            return task
    low = raw.lower().replace("_", "-").replace(" ", "-")
    low = re.sub(r"^task-\d+[a-z]?-", "", low)  # ETO: "task-2a-test-conductivity"
    low = low.replace("(", "").replace(")", "")
    if low in TASK_IDS:
        return low
    raise ValueError(f"unknown ScienceWorld task {name!r}; known: {', '.join(TASK_NAMES)}")


def resolve_tasks(tasks: str | Sequence[str] | None) -> list[str]:
    """``None`` -> all 30; ``"eto"`` -> the 24 of ETO; a name or a list of names/ids -> canonical names."""
    if tasks is None or (isinstance(tasks, str) and tasks.lower() == "all"):
        return list(TASK_NAMES)
    if isinstance(tasks, str) and tasks.lower() == "eto":
        return list(ETO_TASKS)
    if isinstance(tasks, str):
        tasks = [tasks]
    names = [canonical_task(t) for t in tasks]
    if not names:
        raise ValueError("tasks must name at least one task")
    return list(dict.fromkeys(names))  # drop duplicates, keep order


def canonical_split(split: str) -> str:
    key = str(split).lower()
    if key not in SPLIT_ALIASES:
        raise ValueError(f"split must be one of {sorted(SPLIT_ALIASES)}, got {split!r}")
    return SPLIT_ALIASES[key]


def variations(task: str, split: str) -> range:
    """The variation indices of ``task`` in ``split`` (ScienceWorld's own train/dev/test ranges)."""
    n_train, n_dev, n_test = SPLIT_SIZES[canonical_task(task)]
    start = {"train": 0, "dev": n_train, "test": n_train + n_dev}[canonical_split(split)]
    size = {"train": n_train, "dev": n_dev, "test": n_test}[canonical_split(split)]
    return range(start, start + size)


def split_episodes(
    tasks: str | Sequence[str] | None, split: str, variations_per_task: int | None = None
) -> list[tuple[str, int]]:
    """The (task, variation) of every episode of a split, tasks interleaved round-robin."""
    names = resolve_tasks(tasks)
    if variations_per_task is not None and variations_per_task < 1:
        raise ValueError("variations_per_task must be >= 1 (or None for all)")
    per = {t: list(variations(t, split))[:variations_per_task] for t in names}
    longest = max(len(v) for v in per.values())
    return [(t, per[t][i]) for i in range(longest) for t in names if i < len(per[t])]


def _check_episode(task: str, variation: int) -> tuple[str, int]:
    name = canonical_task(task)
    if not 0 <= int(variation) < sum(SPLIT_SIZES[name]):
        raise ValueError(f"{name} has variations 0..{sum(SPLIT_SIZES[name]) - 1}, not {variation}")
    return name, int(variation)


_LAUNCH_LOCK = threading.Lock()


@contextlib.contextmanager
def _java_tool_options(opts: str | None) -> Iterator[None]:
    """Set ``JAVA_TOOL_OPTIONS`` for a JVM launched inside the block (the JVM reads it at start-up)."""
    if not opts:
        yield
        return
    with _LAUNCH_LOCK:
        before = os.environ.get("JAVA_TOOL_OPTIONS")
        os.environ["JAVA_TOOL_OPTIONS"] = f"{before} {opts}" if before else opts
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("JAVA_TOOL_OPTIONS", None)
            else:
                os.environ["JAVA_TOOL_OPTIONS"] = before


def canonical_simplifications(simplifications: str | Sequence[str] | None) -> str:
    """A comma-separated simplification string the engine accepts (validated, order kept)."""
    if not simplifications:
        return ""
    items = simplifications.split(",") if isinstance(simplifications, str) else list(simplifications)
    out = [s.strip() for s in items if s and s.strip()]
    for s in out:
        if s not in SIMPLIFICATIONS:
            raise ValueError(f"unknown simplification {s!r}; known: {', '.join(SIMPLIFICATIONS)}")
    return ",".join(dict.fromkeys(out))


# ------------------------------------------------------------------------------------------------------
# Text helpers
# ------------------------------------------------------------------------------------------------------
def canonical_observation(text: str) -> str:
    """Sort each block of tab-indented lines (the engine lists objects in an unstable order); strip ends."""
    out: list[str] = []
    block: list[str] = []
    for line in (text or "").split("\n"):
        if line.startswith("\t"):
            block.append(line.rstrip())
            continue
        out.extend(sorted(block))
        block = []
        out.append(line.rstrip())
    out.extend(sorted(block))
    return "\n".join(out).strip()


def cap_actions(actions: Sequence[str], limit: int | None) -> list[str]:
    """At most ``limit`` actions, taken round-robin over the first words (verbs) of the sorted list."""
    actions = list(actions)
    if limit is None or len(actions) <= limit:
        return actions
    groups: dict[str, list[str]] = {}
    for action in actions:
        groups.setdefault(action.split(" ", 1)[0], []).append(action)
    out: list[str] = []
    queues = [list(reversed(g)) for g in groups.values()]
    while len(out) < limit:
        for q in queues:
            if q and len(out) < limit:
                out.append(q.pop())
    return sorted(out)


def normalize_command(action: str) -> str:
    """Collapse spaces, drop surrounding quotes/backticks and a final period (the parser rejects them)."""
    cmd = " ".join(str(action).split()).strip("\"'`").strip()
    return cmd.rstrip(".!").strip() or cmd


def _goal_text(task_desc: str) -> str:
    return re.sub(r"^\s*Task Description:\s*", "", task_desc or "").strip()


# ------------------------------------------------------------------------------------------------------
# State keys (SLEA-RL's structurally equivalent states)
# ------------------------------------------------------------------------------------------------------
# The task descriptions' ways of naming the thing a variation is about (the first that matches wins), then the
# generic "focus on the X" (unless X is a kind: "the substance", "the thing")
_GOAL_OBJECT = (
    re.compile(r"your task is to (?:boil|melt|freeze) (.+?)\."),
    re.compile(r"change the state of matter of (.+?)\."),
    re.compile(r"determine if (.+?) is electrically"),
    re.compile(r"create the substance '(.+?)'"),
    re.compile(r"create (.+? paint)\b"),
    re.compile(r"measure the (?:temperature|melting point) of (.+?)[,.]"),
    re.compile(r"grow an? (.+?) plant from seed"),
    re.compile(r"life stages of the (.+?)[,.]"),
    re.compile(r"turn on the (.+?)\."),
    re.compile(r"focus on the (.+?)\."),
)
_KINDS = frozenset({"substance", "thing", "seed", "animal", "plant", "animal with the longest life span",
                    "animal with the shortest life span"})
_GOAL_ROOM = re.compile(r"\b(?:in|around|near) the '?([a-z]+(?: [a-z]+)?)'?(?: location)?(?=[.,])")
_BOX = re.compile(r"\b([a-z]+ box)\b")  # the answer boxes a goal names ("place it in the green box")
_ROOM = re.compile(r"^this (?:room|outside location) is called the (.+?)\.")
_OPEN_DOOR = re.compile(r"a door to the ([a-z ]+?) \(that is open\)")
# "the X" in a feedback clause, X ending before a preposition, a verb or punctuation
_THE = re.compile(r"\bthe ([a-z][a-z0-9 ]*?)(?= (?:to|into|in|on|from|with|is|are|reads|contains)\b|[.,:;(]|$)")


def scienceworld_goal(goal: str) -> tuple[str, str, list[str]]:
    """The thing a ScienceWorld task description is about (``"ice cream"``, ``"apple seed"`` for "grow a apple
    plant"; empty when it names only a kind, "a(n) living thing"), the room it names first, and the boxes it names,
    in order (``["green box", "blue box"]``)."""
    text = " ".join((goal or "").lower().split())
    thing = ""
    for pattern in _GOAL_OBJECT:
        match = pattern.search(text)
        if match and match.group(1) not in _KINDS:
            thing = match.group(1) + (" seed" if pattern.pattern.startswith("grow") else "")
            break
    rooms = [r for r in _GOAL_ROOM.findall(text) if not r.endswith("box")]
    return thing, (rooms[0] if rooms else ""), list(dict.fromkeys(_BOX.findall(text)))


def scienceworld_state_key(observation: str, goal: str) -> StateKey:
    """The structural key of a ScienceWorld observation, from what the agent sees: the observation and the goal
    (the valid-action lists, hundreds long and off in most runs, are not read) (:meth:`ScienceWorldEnv.state_key`).

    ScienceWorld's map and furniture are the same in every variation, so room names stay; what a variation changes
    is written as a role: the goal's object (the substance, object or seed the task is about), the goal's room (the
    room it names first) and the goal's boxes (the answer boxes, in the order the goal names them). Kept: a room
    (which, and its open doors) or the first clause of the feedback with entities as roles (another entity: "an
    object"); whether the goal's object and boxes are in view. Dropped: the room's inventory of furniture, its
    closed doors, numbers, the variation's names (they fill the slots). Example: ``in the goal's room | open doors:
    hallway | the goal's object not in view | the goal's box 1 in view``, slots ``{"goal room": "kitchen", "goal
    box 1": "red box"}``.
    """
    text = (observation or "").strip().lower()
    thing, goal_room, boxes = scienceworld_goal(goal)
    slots: dict[str, str] = {}
    role_of: dict[str, str] = {}
    if thing:
        role_of[thing] = "the goal's object"
    if goal_room:
        role_of[goal_room] = "the goal's room"
    for i, box in enumerate(boxes, 1):
        role_of[box] = f"the goal's box {i}"
    room = _ROOM.match(text)
    parts: list[str] = []
    if room:
        body = " ".join(text.split())
        parts.append("in " + role_of.get(room.group(1), f"the {room.group(1)}"))
        doors = [role_of.get(d, d) for d in _OPEN_DOOR.findall(body)]
        parts.append("open doors: " + ", ".join(doors) if doors else "no open door")
        if thing:
            seen = re.search(rf"\b{re.escape(thing)}\b", body) is not None
            parts.append("the goal's object " + ("in view" if seen else "not in view"))
        parts += [f"{role_of[b]} in view" for b in boxes if re.search(rf"\b{re.escape(b)}\b", body)]
    else:
        first = re.split(r"[.:;(](?:\s|$)|\n", text, maxsplit=1)[0]
        said: list[str] = []  # the roles put in, kept out of the number rewriting by private-use marks

        def put(phrase: str) -> str:
            said.append(phrase)
            return chr(0xE000 + len(said) - 1)

        for entity in sorted(role_of, key=lambda n: (-len(n), n)):
            first = re.sub(rf"\b(?:(?:a|an|the)\s+)?{re.escape(entity)}\b", lambda _, e=entity: put(role_of[e]), first)
        others: list[str] = []

        def name(match: re.Match[str]) -> str:
            entity = match.group(1).strip()
            if entity in ("inventory", "door", "agent") or first.startswith(("you move to", "you teleport to")):
                return match.group(0)
            others.append(entity)
            return put("an object")

        first = re.sub(r"\d+", "#", " ".join(_THE.sub(name, first).split()))
        first = re.sub("[\ue000-\uf8ff]", lambda m: said[ord(m.group(0)) - 0xE000], first)
        for i, entity in enumerate(dict.fromkeys(others), 1):
            slots[f"object {i}"] = entity
        parts.append("after: " + first[:100])
    key = " | ".join(parts)
    for entity, role in role_of.items():
        if role in key:
            slots["goal " + role.removeprefix("the goal's ")] = entity
    return StateKey(key, slots)


# ------------------------------------------------------------------------------------------------------
# The environment
# ------------------------------------------------------------------------------------------------------
class ScienceWorldEnv(TextEnv):
    """ScienceWorld as a slea text env (see the module docstring for tasks, splits, info and reward).

    Args:
        tasks: task names/ids; ``None`` (all 30) or ``"eto"`` (the 24 of ETO / tlm-DRE).
        split: ``"train"``, ``"dev"`` (``"heldout"``, ``"valid"``, ``"seen"``), ``"test"`` (``"unseen"``).
        simplifications: ``""``, ``"easy"`` or any of :data:`SIMPLIFICATIONS` (a list or comma-separated).
        variations_per_task: keep the first ``k`` variations of each task of the split (``None``: all).
        admissible: compute the valid action list for every info (the costliest part of a step).
        max_admissible: keep at most this many admissible actions (round-robin over verbs).
        walkthrough: generate the gold action sequence (cached per episode and process).
        canonical_obs: sort the engine's object lists so identical states read the same.
        java_opts: JVM options (passed as ``JAVA_TOOL_OPTIONS`` when the JVM starts). The default caps the
            heap: a JVM left to its defaults keeps growing over a few episodes; capped, it stays at about half
            of that, at the same speed.
        episodes: play exactly these (task, variation) pairs (e.g. ETO's ``dev_indices.json``), in this
            order, instead of a split (``split`` and ``variations_per_task`` are then ignored).
    """

    snapshots = "replay"  # get_state/set_state: reset the game, replay its commands

    # (task, variation, simplifications) -> gold actions; one per process, so resets agree (module doc).
    _GOLD: ClassVar[dict[tuple[str, int, str], list[str]]] = {}

    def __init__(
        self,
        tasks: str | Sequence[str] | None = None,
        split: str = "train",
        simplifications: str | Sequence[str] | None = "",
        variations_per_task: int | None = None,
        admissible: bool = True,
        max_admissible: int | None = None,
        walkthrough: bool = True,
        canonical_obs: bool = True,
        java_opts: str | None = DEFAULT_JAVA_OPTS,
        episodes: Sequence[tuple[str, int]] | None = None,
    ) -> None:
        super().__init__()
        if max_admissible is not None and max_admissible < 1:
            raise ValueError("max_admissible must be >= 1 (or None)")
        self.tasks = resolve_tasks(tasks)
        self.split = canonical_split(split)
        self.simplifications = canonical_simplifications(simplifications)
        if episodes is not None:
            self.episodes = [_check_episode(task, variation) for task, variation in episodes]
            if not self.episodes:
                raise ValueError("episodes is empty")
            self.tasks = list(dict.fromkeys(task for task, _ in self.episodes))
        else:
            self.episodes = split_episodes(self.tasks, self.split, variations_per_task)
        self.num_episodes = len(self.episodes)
        self.admissible = admissible
        self.max_admissible = max_admissible
        self.want_walkthrough = walkthrough
        self.canonical_obs = canonical_obs
        self.java_opts = java_opts
        self._engine: Any = None  # scienceworld.ScienceWorldEnv (owns the JVM)
        self.jvm_start_s: float | None = None
        self._episode = -1
        self._task = ""
        self._variation = -1
        self._actions: list[str] = []
        self._walkthrough: list[str] = []
        self._score = 0
        self._raw_score = 0
        self._credited = 0
        self._won = False
        self._lost = False
        self._done = False
        self._moves = 0

    # -- the engine ----------------------------------------------------------------------------------
    def _server(self) -> Any:
        if self._engine is None:
            if shutil.which("java") is None:
                raise MissingExtraError(
                    "ScienceWorld needs a Java runtime >= 11 on the PATH (e.g. apt-get install default-jre-headless)"
                )
            from scienceworld import ScienceWorldEnv as Engine

            start = time.perf_counter()
            with _java_tool_options(self.java_opts):
                self._engine = Engine("", envStepLimit=10**9)
            self.jvm_start_s = time.perf_counter() - start
        return self._engine.server

    def _load(self, task: str, variation: int) -> None:
        """Load a variation (the engine's ``load``) and record its walkthrough once."""
        self._server()
        key = (task, variation, self.simplifications)
        server = self._engine.server
        if self.want_walkthrough and key not in self._GOLD:
            self._engine.load(task, variation, self.simplifications, generateGoldPath=True)
            gold = [str(a) for a in server.getGoldActionSequence()]
            # Replay it on a fresh load and cut it where the task completes (some end with a spare "wait1").
            self._engine.load(task, variation, self.simplifications, generateGoldPath=False)
            server.step("look around")
            for i, action in enumerate(gold):
                server.step(action)
                if server.getCompleted() or server.getScore() < 0:
                    gold = gold[: i + 1]
                    break
            self._GOLD[key] = gold
        self._engine.load(task, variation, self.simplifications, generateGoldPath=False)
        self._walkthrough = list(self._GOLD.get(key, []))

    def _valid_actions(self) -> list[str] | None:
        if not self.admissible:
            return None
        # One string over the gateway instead of a py4j round trip per list element.
        joined = self._engine._gateway.jvm.java.lang.String.join(
            "\n", self._engine.server.getValidActionObjectCombinations()
        )
        actions = sorted({a for a in str(joined).split("\n") if a})
        return cap_actions(actions, self.max_admissible)

    def _obs(self, text: str) -> str:
        text = str(text or "")
        return canonical_observation(text) if self.canonical_obs else text.strip()

    # -- the contract ---------------------------------------------------------------------------------
    instructions = INSTRUCTIONS
    expert_source = "gold_path"  # info["walkthrough"]: the engine's gold action sequence

    def _episode_index(self, seed: int | None, options: dict[str, Any]) -> int:
        if options.get("task") is not None:
            task = canonical_task(options["task"])
            if options.get("variation") is None:
                raise ValueError("options['task'] needs options['variation'] too")
            pair = (task, int(options["variation"]))
            if pair not in self.episodes:
                raise ValueError(f"{pair} is not an episode of this env's {self.split} split")
            return self.episodes.index(pair)
        return self._pick(self.num_episodes, seed, options, key="episode")

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = self._episode_index(seed, options)
        task, variation = self.episodes[index]
        self._load(task, variation)
        server = self._engine.server
        obs = server.step("look around")
        self._episode, self._task, self._variation = index, task, variation
        self.task_type = task
        self._actions = []
        self._raw_score = round(100 * float(server.getScore()))
        self._score = max(0, min(MAX_SCORE, self._raw_score))
        self._credited = 0  # score already paid out as reward (the start's own score goes to the first step)
        self._won = self._lost = self._done = False
        self._moves = int(server.getNumMoves())
        self._goal = _goal_text(str(server.freeActionTaskDesc()))
        self._admissible = self._valid_actions()
        return self._obs(obs), {}

    def _step(self, action: str) -> StepResult:
        if self._episode < 0:
            return self._reject("Call reset() before step().")
        if self._done:
            return self._reject("The episode is over.")
        server = self._engine.server
        action = normalize_command(action)
        raw = str(server.step(action))
        self._actions.append(action)
        raw_score = round(100 * float(server.getScore()))
        completed = bool(server.getCompleted())
        score = max(0, min(MAX_SCORE, raw_score))
        reward = (score - self._credited) / MAX_SCORE
        self._score, self._raw_score, self._credited = score, raw_score, score
        self._lost = raw_score < 0
        self._won = completed and not self._lost and raw_score >= MAX_SCORE
        self._done = completed or self._lost
        self._moves = int(server.getNumMoves())
        self._admissible = None if self._done else self._valid_actions()
        info = {
            "invalid": raw.lstrip().startswith(_UNKNOWN),
            "ambiguous": raw.lstrip().startswith(_AMBIGUOUS),
        }
        return self._obs(raw), reward, self._done, False, info

    def state_key(self, observation: str) -> StateKey:
        """The observation's structural key (:func:`scienceworld_state_key`), read from the observation and the
        goal only (never the gold path, the score or the simulator's state). It keeps the room (and its open doors)
        or the feedback's first clause with entities as roles, and whether the goal's object and boxes are in
        view; the variation's names fill the slots. Example: ``in the goal's room | open doors: hallway | the
        goal's object not in view | the goal's box 1 in view``."""
        return scienceworld_state_key(observation, self._goal)

    def _info_defaults(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "won": self._won,
            "lost": self._lost,
            "walkthrough": list(self._walkthrough),
            "score": self._score,
            "raw_score": self._raw_score,
            "max_score": MAX_SCORE,
            "moves": self._moves,
            "ambiguous": False,
        }
        if self._episode >= 0:
            info.update(
                task=self._task,
                task_id=TASK_IDS[self._task],
                variation=self._variation,
                episode=self._episode,
                split=self.split,
            )
        return info

    # -- snapshots (replay) -------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The episode and the actions since reset (replayed by :meth:`set_state`)."""
        if self._episode < 0:
            raise RuntimeError("get_state() before reset()")
        return {
            "task": self._task,
            "variation": self._variation,
            "simplifications": self.simplifications,
            "actions": list(self._actions),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Reload the snapshot's variation and replay its actions (only the last step lists actions)."""
        if state.get("simplifications", self.simplifications) != self.simplifications:
            raise ValueError("snapshot taken with other simplifications")
        actions = list(state.get("actions", []))
        keep = self.admissible
        self.admissible = False  # no valid-action lists while replaying
        try:
            self.reset(options={"task": state["task"], "variation": int(state["variation"])})
            for action in actions:
                self.step(action)
        finally:
            self.admissible = keep
        self._admissible = None if self._done else self._valid_actions()

    def render(self) -> str:
        return self._last_obs

    def close(self) -> None:
        if self._engine is not None:
            engine, self._engine = self._engine, None
            with contextlib.suppress(Exception):
                engine.close()
        super().close()


# ------------------------------------------------------------------------------------------------------
# Registration (cheap: nothing of scienceworld is imported here)
# ------------------------------------------------------------------------------------------------------
_ENTRY = "slea.envs.scienceworld:ScienceWorldEnv"
_COMMON = {"family": "scienceworld", "extra": "scienceworld", "requires": ("scienceworld", "py4j")}

register(
    "slea/ScienceWorld-v0",
    _ENTRY,
    description="ScienceWorld: the 30 tasks, ScienceWorld's train/dev/test variations (needs Java >= 11)",
    **_COMMON,
)
register(
    "slea/ScienceWorld-ETO-v0",
    _ENTRY,
    description="ScienceWorld: the 24 tasks of ETO / tlm-DRE (seen = dev, unseen = test variations)",
    tasks="eto",
    **_COMMON,
)
