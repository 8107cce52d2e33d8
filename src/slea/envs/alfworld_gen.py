"""An offline generator of ALFRED-domain ALFWorld games, and the engine that plays them.

The official ALFWorld games (3,553 train, 140 seen, 134 unseen) are a download; this module writes new ones in
the same format from a seed, with no download: a room of one of ALFRED's four scene types (kitchen, living
room, bedroom, bathroom) with its receptacles, pickable objects placed where ALFRED's affordance table
(``alfworld.gen.constants.VAL_RECEPTACLE_OBJECTS``) allows them, and a goal of one of the six task types,
written against the PDDL domain (``alfred.pddl``) and text grammar (``alfred.twl2``) that the ``alfworld``
package ships. The goal's PDDL is the package's own (``alfworld.gen.goal_library``), and so are its task
templates ("put a clean mug in cabinet").

A game is a folder holding ``game.tw-pddl`` (JSON: ``pddl_domain``, ``grammar``, ``pddl_problem``,
``solvable``, ``walkthrough``) and ``traj_data.json`` (``task_type``, ``pddl_params``...: what the engine's
hand-coded expert reads), the official layout. Every game is checked before it is kept: the engine's
hand-coded expert (``AlfredExpert``) must win it within :data:`MAX_EXPERT_STEPS` steps, and its winning
commands become the game's ``walkthrough``; a room the expert does not solve is redrawn (next attempt).

Generation is deterministic in (task type, seed, :data:`GEN_VERSION`): string-seeded ``random.Random``
streams, sorted iteration, and the expert run under a seeded ``random`` state (it breaks ties at random).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from slea.atomic import atomic_write_text

GEN_VERSION = 1
MAX_EXPERT_STEPS = 40  # the GiGPO protocol allows 50 steps; keep a margin
MAX_ATTEMPTS = 20

# Short names (the papers' table columns) -> ALFRED task types (the game folder names start with these); the one
# table of the family (slea.envs.alfworld imports it: this module imports no engine at import time).
TASK_TYPES: dict[str, str] = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "pick_two": "pick_two_obj_and_place",
}
SHORT_NAMES: dict[str, str] = {full: short for short, full in TASK_TYPES.items()}

# Scene types: receptacle (type, min, max) counts and the objects that may appear. ALFRED's own scenes have
# these receptacles; the counts are smaller than ALFRED's (20-40 receptacles) to keep episodes short.
ROOMS: dict[str, dict[str, Any]] = {
    "kitchen": {
        "receptacles": [
            ("CounterTop", 1, 2),
            ("Cabinet", 2, 5),
            ("Drawer", 1, 3),
            ("Fridge", 1, 1),
            ("Microwave", 1, 1),
            ("SinkBasin", 1, 1),
            ("StoveBurner", 1, 3),
            ("CoffeeMachine", 1, 1),
            ("GarbageCan", 1, 1),
            ("Toaster", 0, 1),
            ("DiningTable", 0, 1),
            ("Shelf", 0, 2),
        ],
        "objects": [
            "Apple", "Bowl", "Bread", "ButterKnife", "Cup", "DishSponge", "Egg", "Fork", "Kettle", "Knife",
            "Ladle", "Lettuce", "Mug", "Pan", "PepperShaker", "Plate", "Pot", "Potato", "SaltShaker",
            "SoapBottle", "Spatula", "Spoon", "Tomato", "WineBottle",
        ],
    },
    "livingroom": {
        "receptacles": [
            ("Sofa", 1, 1),
            ("ArmChair", 0, 2),
            ("CoffeeTable", 1, 1),
            ("SideTable", 1, 2),
            ("TVStand", 0, 1),
            ("Drawer", 1, 3),
            ("Cabinet", 0, 2),
            ("Shelf", 1, 3),
            ("Dresser", 0, 1),
            ("GarbageCan", 1, 1),
            ("Ottoman", 0, 1),
        ],
        "objects": [
            "Book", "Box", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Newspaper", "Pillow",
            "RemoteControl", "Statue", "TissueBox", "Vase", "Watch", "WateringCan", "Bowl", "Plate",
        ],
    },
    "bedroom": {
        "receptacles": [
            ("Bed", 1, 1),
            ("Desk", 0, 1),
            ("SideTable", 1, 2),
            ("Drawer", 2, 4),
            ("Dresser", 0, 1),
            ("Shelf", 1, 3),
            ("GarbageCan", 1, 1),
            ("LaundryHamper", 0, 1),
            ("Safe", 0, 1),
            ("ArmChair", 0, 1),
        ],
        "objects": [
            "AlarmClock", "BaseballBat", "BasketBall", "Book", "CD", "CellPhone", "Cloth", "CreditCard",
            "KeyChain", "Laptop", "Mug", "Pen", "Pencil", "Pillow", "TennisRacket", "Bowl", "Watch",
        ],
    },
    "bathroom": {
        "receptacles": [
            ("Toilet", 1, 1),
            ("SinkBasin", 1, 2),
            ("BathtubBasin", 0, 1),
            ("CounterTop", 1, 1),
            ("Cabinet", 1, 4),
            ("Drawer", 0, 2),
            ("GarbageCan", 1, 1),
            ("HandTowelHolder", 0, 1),
            ("TowelHolder", 1, 1),
            ("ToiletPaperHanger", 1, 1),
            ("Shelf", 0, 2),
        ],
        "objects": [
            "Candle", "Cloth", "DishSponge", "HandTowel", "Plunger", "ScrubBrush", "SoapBar", "SoapBottle",
            "SprayBottle", "TissueBox", "ToiletPaper", "Towel", "SaltShaker",
        ],
    },
}  # fmt: skip
# Which scene types each task type is drawn in (ALFRED's GOALS_VALID).
TASK_ROOMS: dict[str, tuple[str, ...]] = {
    "pick": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "pick_two": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "look": ("livingroom", "bedroom"),
    "clean": ("kitchen", "bathroom"),
    "heat": ("kitchen",),
    "cool": ("kitchen",),
}
LAMP_HOLDERS = ("Desk", "SideTable", "Dresser")
# The appliance a task uses cannot be its destination (ALFRED's tasks do not ask to heat X into the microwave).
_APPLIANCE = {"clean": ("SinkBasin", "BathtubBasin"), "heat": ("Microwave",), "cool": ("Fridge",)}
_PROPERTY = {"clean": "Cleanable", "heat": "Heatable", "cool": "Coolable"}
# Object extras the ALFRED affordance table misses (towels hang on their holders; some only sit on counters).
_EXTRA_PLACES = {"Towel": ("TowelHolder",), "ScrubBrush": ("Toilet", "CounterTop"), "Plunger": ("Toilet",)}


# ------------------------------------------------------------------------------------------------------
# The engine (textworld's PddlEnv + alfworld's wrappers)
# ------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def engine_guard() -> Iterator[None]:
    """fast-downward's PDDL translator overwrites ``sys.argv``; put it back after every engine call."""
    argv = list(sys.argv)
    try:
        yield
    finally:
        sys.argv[:] = argv


_ACCELERATED = False


class PlannerFailed(RuntimeError):
    """The planner expert (fast-downward) found no plan from a state of an unfinished game."""


class GenerationError(RuntimeError):
    """No game could be made: the engine failed on a drawn room, or no room was solved in MAX_ATTEMPTS."""


def accelerate_engine() -> None:
    """Make textworld's PDDL engine faster, with the same text out (idempotent, process-wide).

    textworld re-parses, with tatsu, every grammar template and rule condition each time it renders a command
    or an observation, deep-copies the whole derivation context for every symbol, and re-translates the PDDL
    problem with fast-downward on every reset. The parses and
    the translation are pure functions of their text arguments, so their results are cached: the text-grammar
    parser (results deep-copied, since derivation sets their context), the conjunctive queries of rule
    conditions (only the text generator's name is rebound), and ``pddl2sas`` (its task is only read). The
    context copies become dict copies (derivation adds or replaces entries, never mutates the values).
    tests/envs/test_alfworld.py checks that a game plays to the same text with and without it.
    """
    global _ACCELERATED
    if _ACCELERATED:
        return
    import copy
    import functools
    import types

    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl import textgen

    parse = textgen._parse_and_convert
    base_rule = textgen.Rule

    @functools.lru_cache(maxsize=4096)
    def _parsed(text: str, rule_name: str) -> Any:
        return parse(text, rule_name=rule_name)

    def parse_and_convert(text: str, rule_name: str = "symbols", trace: bool = False) -> Any:
        if trace:
            return parse(text, rule_name=rule_name, trace=trace)
        return copy.deepcopy(_parsed(text, rule_name))

    class Rule(base_rule):  # only the text generator's name is rebound: the rest of textworld is untouched
        @classmethod
        @functools.lru_cache(maxsize=4096)
        def parse_conjunctive_query(cls, expr: str) -> Any:
            return base_rule.parse_conjunctive_query(expr)

    @functools.lru_cache(maxsize=64)
    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        with engine_guard():
            return fast_downward.pddl2sas(domain, problem, verbose=verbose, optimize=optimize)

    def copy_context(context: dict[str, Any]) -> dict[str, Any]:
        # textworld deep-copies the variables and mapping (EntityInfo, Variable objects) for every symbol;
        # derivation only adds or replaces entries of these dicts, never mutates the values: copy the dicts.
        return {**context, "variables": dict(context["variables"]), "mapping": dict(context["mapping"])}

    textgen._parse_and_convert = parse_and_convert
    textgen.copy_context = copy_context
    textgen.Rule = Rule
    proxy = types.SimpleNamespace(**{k: getattr(fast_downward, k) for k in dir(fast_downward)})
    proxy.pddl2sas = pddl2sas
    pddl_logic.fast_downward = proxy
    _ACCELERATED = True


def make_engine(expert: str | None = "handcoded", facts: bool = False, accelerate: bool = True) -> Any:
    """A textworld PDDL engine wrapped as ALFWorld does (demangled names, gamefile info, optional expert).

    ``expert``: ``"handcoded"`` (alfworld's rule-based expert: explores like an agent; ``extra.expert_plan``
    is its next command), ``"planner"`` (fast-downward's optimal plan from the true state), or None.
    """
    import textworld
    from alfworld.agents.environment.alfred_tw_env import (
        AlfredDemangler,
        AlfredExpert,
        AlfredExpertType,
        AlfredInfos,
    )
    from alfworld.agents.expert.handcoded_expert import HandCodedAgentFailed
    from textworld.envs import PddlEnv

    if accelerate:
        accelerate_engine()

    class Pddl(PddlEnv):
        """textworld's PDDL env, reading a game file through a closed handle (its own ``load`` leaves the file to
        the garbage collector: a ResourceWarning per load)."""

        def load(self, filename_or_data: Any) -> None:
            if isinstance(filename_or_data, (str, os.PathLike)):
                with open(filename_or_data, encoding="utf-8") as fh:
                    super().load(json.load(fh))
                self._game_file = filename_or_data
            else:
                super().load(filename_or_data)

    class Expert(AlfredExpert):
        """alfworld's expert, with its state tracking taught the grammar's ``move X to Y`` command.

        The hand-coded policy pops its inventory only after a command containing "put" (the grammar's old
        verb); with "move" it keeps holding the first object in its mind and, in pick-two tasks, keeps
        proposing to move it (inadmissible) instead of the one in hand. It is shown "put ..." instead.
        """

        def step(self, command: str) -> Any:
            self.state, reward, done = textworld.core.Wrapper.step(self, command)
            command = str(command)
            self.prev_command = "put " + command[5:] if command.startswith("move ") else command
            self._gather_infos()
            return self.state, reward, done

        def _gather_infos(self) -> None:
            # The hand-coded expert gives up by raising after the game has already stepped: HandCodedAgentFailed
            # (no subgoal left), or alfworld's plain Exception("Timeout") (its step budget). That is "no advice"
            # (an empty plan, the step kept); any other exception is an engine failure and propagates.
            try:
                super()._gather_infos()
            except HandCodedAgentFailed:
                self.state["extra.expert_plan"] = []
            except Exception as exc:
                if type(exc) is not Exception or exc.args != ("Timeout",):
                    raise
                self.state["extra.expert_plan"] = []
            if self.expert_type == AlfredExpertType.PLANNER and not self.state.get("won") and \
                    not self.state.get("extra.expert_plan"):
                raise PlannerFailed("fast-downward found no plan from this state")

    infos = textworld.EnvInfos(
        won=True, admissible_commands=True, facts=facts, extras=["gamefile", "walkthrough"]
    )
    env = AlfredInfos(AlfredDemangler(Pddl(infos), shuffle=False))
    if expert:
        kind = {"handcoded": AlfredExpertType.HANDCODED, "planner": AlfredExpertType.PLANNER}[expert]
        env = Expert(env, expert_type=kind)
    return env


@contextlib.contextmanager
def seeded_random(state: Any) -> Iterator[list[Any]]:
    """Run with the global ``random`` in ``state`` (the hand-coded expert uses it); yield a box with the new
    state; the caller's own global state is restored afterwards."""
    outer = random.getstate()
    random.setstate(state)
    box = [state]
    try:
        yield box
    finally:
        box[0] = random.getstate()
        random.setstate(outer)


def play_expert(
    engine: Any, game_file: str, seed: int, max_steps: int = MAX_EXPERT_STEPS
) -> list[str] | None:
    """The expert's commands until it wins; None when it gives up (no advice), loses, or needs more than
    ``max_steps`` (the room is then redrawn). An engine or planner failure raises: it is never read as a room
    the expert cannot solve, nor stored as an empty plan."""
    rng_state = random.Random(f"expert:{seed}").getstate()
    commands: list[str] = []
    with engine_guard(), seeded_random(rng_state):
        engine.load(game_file)
        state = engine.reset()
        for _ in range(max_steps):
            plan = state.get("extra.expert_plan") or []
            if not plan:
                return None
            commands.append(plan[0])
            state, _score, done = engine.step(plan[0])
            if state.get("won"):
                return commands
            if done:
                return None
    return None


# ------------------------------------------------------------------------------------------------------
# Rooms and goals (pure Python)
# ------------------------------------------------------------------------------------------------------
@dataclass
class Room:
    """A sampled scene: receptacles by id, objects by id with their receptacle, and the goal parameters."""

    room_type: str
    receptacles: dict[str, str] = field(default_factory=dict)  # id -> type
    locations: dict[str, str] = field(default_factory=dict)  # receptacle id -> location id
    objects: dict[str, str] = field(default_factory=dict)  # id -> type
    placed_in: dict[str, str] = field(default_factory=dict)  # object id -> receptacle id
    start: str = ""
    params: dict[str, Any] = field(default_factory=dict)


def _affordances() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    from alfworld.gen import constants as c

    places: dict[str, set[str]] = {}
    for rtype, otypes in c.VAL_RECEPTACLE_OBJECTS.items():
        for otype in otypes:
            places.setdefault(otype, set()).add(rtype)
    for otype, rtypes in _EXTRA_PLACES.items():
        places.setdefault(otype, set()).update(rtypes)
    props = {name: set(objs) for name, objs in c.VAL_ACTION_OBJECTS.items()}
    return places, props


def _coord(rng: random.Random) -> str:
    parts = []
    for _ in range(3):
        value = rng.uniform(-3.0, 3.0)
        sign = "_plus_" if value >= 0 else "_minus_"
        whole, frac = f"{abs(value):05.2f}".split(".")
        parts.append(f"{sign}{whole}_dot_{frac}")
    return "_bar_".join(parts)


def _entity_id(otype: str, rng: random.Random, taken: set[str]) -> str:
    while True:
        if otype in ("SinkBasin", "BathtubBasin"):  # ALFRED's ids: "Sink|x|y|z|SinkBasin" -> "sinkbasin 1"
            ident = f"{otype[: -len('Basin')]}_bar_{_coord(rng)}_bar_{otype}"
        else:
            ident = f"{otype}_bar_{_coord(rng)}"
        if ident not in taken:
            taken.add(ident)
            return ident


def _location_id(rng: random.Random, taken: set[str]) -> str:
    while True:
        nums = [rng.randint(-9, 9), rng.randint(-9, 9), rng.randint(0, 3), rng.choice([0, 30, 45, 60])]
        ident = "loc" + "".join("_bar_" + (f"_minus_{-n}" if n < 0 else str(n)) for n in nums)
        if ident not in taken:
            taken.add(ident)
            return ident


def sample_room(task: str, rng: random.Random) -> Room | None:
    """Draw a room and a goal of ``task`` (short name); None when this draw admits no goal."""
    places, props = _affordances()
    room_type = rng.choice(TASK_ROOMS[task])
    spec = ROOMS[room_type]
    room = Room(room_type)
    taken: set[str] = set()
    for rtype, lo, hi in spec["receptacles"]:
        for _ in range(rng.randint(lo, hi)):
            rid = _entity_id(rtype, rng, taken)
            room.receptacles[rid] = rtype
            room.locations[rid] = _location_id(rng, taken)
    room.start = _location_id(rng, taken)
    present = sorted(set(room.receptacles.values()))
    if task == "look" and not set(LAMP_HOLDERS) & set(present):
        return None

    def holders(otype: str, exclude: tuple[str, ...] = ()) -> list[str]:
        return sorted(
            r for r, t in room.receptacles.items() if t in places.get(otype, ()) and t not in exclude
        )

    # the goal: target object type, destination type (or lamp type)
    candidates = [o for o in spec["objects"] if holders(o)]
    if task in _PROPERTY:
        candidates = [o for o in candidates if o in props[_PROPERTY[task]]]
    rng.shuffle(candidates)
    params: dict[str, Any] = {}
    for otype in candidates:
        if task == "look":
            params = {"object_target": otype, "parent_target": "", "toggle_target": ""}
            break
        dests = sorted(t for t in present if t in places.get(otype, ()) and t not in _APPLIANCE.get(task, ()))
        rng.shuffle(dests)
        for dest in dests:
            if holders(otype, exclude=(dest,)):  # somewhere else to start from
                params = {"object_target": otype, "parent_target": dest, "toggle_target": ""}
                break
        if params:
            break
    if not params:
        return None
    target, dest = params["object_target"], params["parent_target"]

    # the targets (never already in a receptacle of the destination type), then the lamp, then distractors
    count = rng.randint(2, 3) if task == "pick_two" else rng.randint(1, 2)
    for _ in range(count):
        oid = _entity_id(target, rng, taken)
        room.objects[oid] = target
        room.placed_in[oid] = rng.choice(holders(target, exclude=(dest,)))
    if task == "look":
        lamp = rng.choice(["DeskLamp", "DeskLamp", "FloorLamp"])
        params["toggle_target"] = lamp
        oid = _entity_id(lamp, rng, taken)
        room.objects[oid] = lamp
        room.placed_in[oid] = rng.choice(sorted(r for r, t in room.receptacles.items() if t in LAMP_HOLDERS))
    others = [o for o in spec["objects"] if o != target and holders(o)]
    for _ in range(rng.randint(6, 12)):
        otype = rng.choice(others)
        allowed = holders(otype)
        oid = _entity_id(otype, rng, taken)
        room.objects[oid] = otype
        room.placed_in[oid] = rng.choice(allowed)
    params.update(mrecep_target="", object_sliced=False)
    room.params = params
    return room


def pddl_problem(room: Room, task: str, name: str) -> str:
    """The PDDL problem of a room: objects, initial facts, and the goal from alfworld's goal library."""
    from alfworld.gen import goal_library

    _, props = _affordances()
    places, _ = _affordances()
    otypes = sorted(set(room.objects.values()) | {"Knife", "ButterKnife"})
    rtypes = sorted(set(room.receptacles.values()) | {"SinkBasin", "Microwave", "Fridge"})
    lines = [f"(define (problem {name})", "(:domain alfred)", "(:objects", "    agent1 - agent"]
    lines += [f"    {t}Type - otype" for t in otypes] + [f"    {t}Type - rtype" for t in rtypes]
    lines += [f"    {o} - object" for o in sorted(room.objects)]
    lines += [f"    {r} - receptacle" for r in sorted(room.receptacles)]
    locs = sorted(set(room.locations.values()) | {room.start})
    lines += [f"    {loc} - location" for loc in locs] + [
        ")",
        "(:init",
        f"    (atLocation agent1 {room.start})",
    ]
    for rid in sorted(room.receptacles):
        rtype = room.receptacles[rid]
        lines.append(f"    (receptacleType {rid} {rtype}Type)")
        lines.append(f"    (receptacleAtLocation {rid} {room.locations[rid]})")
        if rtype in ("Fridge", "Cabinet", "Microwave", "Drawer", "Safe"):
            lines.append(f"    (openable {rid})")
    flags = (
        ("Cleanable", "cleanable"),
        ("Heatable", "heatable"),
        ("Coolable", "coolable"),
        ("Sliceable", "sliceable"),
    )
    for oid in sorted(room.objects):
        otype, rid = room.objects[oid], room.placed_in[oid]
        lines.append(f"    (objectType {oid} {otype}Type)")
        if otype in ("DeskLamp", "FloorLamp"):
            lines.append(f"    (toggleable {oid})")
        else:
            lines.append(f"    (pickupable {oid})")
        for prop, pred in flags:
            if otype in props[prop]:
                lines.append(f"    ({pred} {oid})")
        if otype in ("Bowl", "Cup", "Mug", "Plate", "Pan", "Pot", "Box"):
            lines.append(f"    (isReceptacleObject {oid})")
        lines.append(f"    (inReceptacle {oid} {rid})")
        lines.append(f"    (objectAtLocation {oid} {room.locations[rid]})")
    for rtype in rtypes:
        for otype in otypes:
            if rtype in places.get(otype, ()):
                lines.append(f"    (canContain {rtype}Type {otype}Type)")
    lines.append(")")
    p = room.params
    goal = goal_library.gdict[TASK_TYPES[task]]["pddl"].replace("#", "-")
    goal = goal.format(obj=p["object_target"], recep=p["parent_target"], toggle=p["toggle_target"], mrecep="")
    return "\n".join(lines) + "\n" + goal.strip() + "\n"


def task_description(room: Room, task: str, rng: random.Random) -> str:
    """A templated goal text as ALFWorld writes it (``alfworld.agents.utils.misc.get_templated_task_desc``)."""
    from alfworld.gen import goal_library

    p = room.params
    template = rng.choice(goal_library.gdict[TASK_TYPES[task]]["templates"])
    return template.format(
        obj=p["object_target"].lower(),
        recep=p["parent_target"].lower(),
        toggle=p["toggle_target"].lower(),
        mrecep="",
    )


def build_game(task: str, seed: int, attempt: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(gamedata, traj_data) of attempt ``attempt`` for (task, seed), unverified; None if the draw failed."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    rng = random.Random(f"slea-alfworld:{GEN_VERSION}:{task}:{seed}:{attempt}")
    room = sample_room(task, rng)
    if room is None:
        return None
    desc = task_description(room, task, rng)
    with open(ALFRED_PDDL_PATH, encoding="utf-8") as fh:
        domain = fh.read()
    with open(ALFRED_TWL2_PATH, encoding="utf-8") as fh:
        grammar = fh.read().replace("UNKNOWN GOAL", desc)
    name = f"slea_{task}_{seed}_{attempt}"
    gamedata = {
        "pddl_domain": domain,
        "grammar": grammar,
        "pddl_problem": pddl_problem(room, task, name),
        "solvable": None,
        "walkthrough": None,
    }
    traj = {
        "task_type": TASK_TYPES[task],
        "pddl_params": room.params,
        "scene": {"room_type": room.room_type, "generator": f"slea.envs.alfworld_gen/{GEN_VERSION}"},
        "task_id": name,
        "turk_annotations": {"anns": [{"task_desc": desc}]},
        "slea": {"task": task, "seed": seed, "attempt": attempt, "gen_version": GEN_VERSION},
    }
    return gamedata, traj


def write_game(folder: Any, gamedata: dict[str, Any], traj: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "traj_data.json", json.dumps(traj, indent=1, sort_keys=True))
    atomic_write_text(folder / "game.tw-pddl", json.dumps(gamedata, sort_keys=True))


def generate(task: str, seed: int, workdir: Any, engine: Any = None) -> tuple[Any, dict[str, Any]]:
    """Make a verified game of ``task`` (short name) from ``seed`` under ``workdir``; return (folder, traj).

    Draws rooms (attempt 0, 1, ...) until the hand-coded expert wins one within :data:`MAX_EXPERT_STEPS`; its
    commands are stored as the game's walkthrough.
    """
    if task not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type {task!r}; known: {', '.join(TASK_TYPES)}")
    engine = engine or make_engine("handcoded")
    for attempt in range(MAX_ATTEMPTS):
        built = build_game(task, seed, attempt)
        if built is None:
            continue
        gamedata, traj = built
        folder = workdir / f"attempt-{attempt}"
        write_game(folder, gamedata, traj)
        try:
            walkthrough = play_expert(engine, str(folder / "game.tw-pddl"), seed)
        except Exception as exc:
            raise GenerationError(f"generating ALFWorld {task} game {seed} (attempt {attempt}): the engine "
                                  f"failed: {type(exc).__name__}: {exc}") from exc
        if walkthrough:
            gamedata.update(solvable=True, walkthrough=walkthrough)
            traj["slea"]["expert_steps"] = len(walkthrough)
            write_game(folder, gamedata, traj)
            return folder, traj
    raise GenerationError(f"no solvable {task} game for seed {seed} in {MAX_ATTEMPTS} attempts")
