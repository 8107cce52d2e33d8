"""Recall (``slea/Recall-v0``): a positive control for experience retrieval — a lesson about a state is the
only way to act right in it without learning.

A game is a walk through ``chambers`` (k) chambers of a vault. Every chamber is one of ``len(CHAMBERS)`` (S)
*chamber types*, each with its own fixed description. In each chamber the agent answers with one gesture of
:data:`GESTURES` (A); one gesture is right for that chamber type, in every game, and it is arbitrary: nothing in
the text says which (the table :data:`RIGHT` is fixed; the descriptions are about stone, light and smells, not
about gestures). A right gesture earns ``1/k`` and opens the next chamber; a wrong one ends the game (lost,
reward 0). Winning = all k right, return 1. A uniformly random gesture wins with probability ``(1/A)^k``
(:func:`chance`), 1/64 with the defaults.

What recurs across games, and what does not. A game draws k distinct chamber types in a random order and, for
each chamber, a warden's name and an object standing in the chamber (the distractors) from its split's pools.
The training and held-out splits use disjoint pools (:data:`NAMES`, :data:`THINGS`): held-out games show names
and objects never seen in training, with the same chamber types and the same right gestures. Observations of
one chamber type differ only in those names, so SLEA-RL's observation clusters (difflib ratio ≥ δ = 0.85 against
the cluster's first member) put every game's visit of that type into one cluster, and different types into
different clusters (tests/envs/test_recall.py checks both with the real ``ObservationIndex``). A lesson learned in
training ("'clap' earned the reward on this kind of task", linked to the cluster where it was earned) is then
retrieved at that cluster in a held-out game and names the right gesture.

Actions are single words, so the rule extractor's command shapes keep them whole (a bare verb is its own shape).
The admissible gestures are listed in a per-chamber shuffled order (seeded by the game), so a position in the
list carries no information. Anything not in the list is ``invalid`` (the game does not move). Seeds:
``reset(seed=k)`` plays game ``k`` of the split (``k % num_games`` when ``num_games`` is set); ``options={"game":
k}`` does the same. Deterministic: a game is a function of (split, game). ``get_state()/set_state()`` are exact.
``info["walkthrough"]`` holds the game's right gestures (the expert; never shown to the agent).

State key (:meth:`RecallEnv.state_key`): the chamber type, recognised from its fixed description in the
observation, with the warden's name and the object as slots: ``library chamber: the warden and the object``
with ``{"warden": "Jory", "object": "a folded map"}``. The right gesture is never read.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from slea.envs.base import StepResult, TextEnv, register, user_turn
from slea.types import Instructions, StateKey

# The gestures (A = 4). Single words, none of them a look/wait verb, none suggested by a chamber's text.
GESTURES: tuple[str, ...] = ("whistle", "bow", "clap", "kneel")

# The chamber types (S = 6): (key, description). ``{name}`` is the warden, ``{thing}`` an object in the chamber.
# Long, distinct descriptions with short slots: same-type observations stay above δ = 0.85, other types far below.
CHAMBERS: tuple[tuple[str, str], ...] = (
    ("cistern", ("A round cistern of green stone. Water drips from a crack in the dome into a shallow basin, and "
                "the air smells of moss. {name} the warden sits on the rim of the basin next to {thing}.")),
    ("gallery", ("A long gallery hung with faded portraits in gilt frames. The floorboards creak and a cold "
                "draught blows from the far end. {name} the warden leans on a railing beside {thing}.")),
    ("forge", ("A low forge full of soot. Embers glow under a great iron hood and the walls are warm to the "
              "touch. {name} the warden stands by the anvil with {thing} at their feet.")),
    ("library", ("A quiet library of tall oak shelves. Dust floats in a beam of pale light from a high window. "
                "{name} the warden reads at a lectern, and {thing} lies on the reading table.")),
    ("garden", ("A sunken garden under an open sky. Ivy climbs the walls, bees hum over a bed of lavender and a "
               "fountain murmurs. {name} the warden sits in the grass near {thing}.")),
    ("vault", ("A narrow vault of black marble. Candles burn in niches along both walls and every footstep "
              "echoes twice. {name} the warden waits at the far door, {thing} propped against it.")),
)

# The right gesture of each chamber type: fixed, arbitrary (every gesture is right somewhere).
RIGHT: dict[str, str] = {"cistern": "clap", "gallery": "kneel", "forge": "whistle", "library": "bow",
                         "garden": "whistle", "vault": "clap"}

# Distractor pools per split, disjoint: held-out games use names and objects never seen in training.
NAMES: dict[str, tuple[str, ...]] = {
    "train": ("Orla", "Bram", "Edda", "Tomas", "Ilse", "Corin", "Mara", "Jory", "Wren", "Aldo", "Nell", "Piet",
              "Sunniva", "Hugo", "Lisbet", "Osric", "Fenna", "Darius", "Greta", "Milo", "Tove", "Ansel", "Rhea",
              "Bastian"),
    "heldout": ("Yusuf", "Kaia", "Lorcan", "Ines", "Viggo", "Zelda", "Anouk", "Cyrus", "Mette", "Ramon", "Sabine",
                "Tobias", "Ulla", "Emeric", "Freya", "Gideon", "Hester", "Ivo", "Juno", "Kasimir", "Lotte",
                "Nils", "Odile", "Pavel"),
}
THINGS: dict[str, tuple[str, ...]] = {
    "train": ("a broken lantern", "an empty crate", "a coil of rope", "a rusty bucket", "a folded map",
              "a wooden stool", "a cracked jug", "a pile of sacks", "a bundle of reeds", "a tin lunch box",
              "a leather satchel", "a brass scale", "a clay pot", "a spare boot", "a torn banner",
              "a stack of slates"),
    "heldout": ("a painted shield", "a basket of eggs", "a bent spoon", "a glass float", "a copper kettle",
                "a woollen shawl", "a dented helmet", "a jar of honey", "a bone flute case", "a tally stick",
                "a silk cushion", "a pewter mug", "a chipped bowl", "a hunting horn", "a wicker cage",
                "a bag of nails"),
}
SPLITS = ("train", "heldout")

GOAL = ("Cross the vault: in each chamber make the one gesture that makes its warden let you pass. A wrong "
        "gesture ends the attempt.")
WIN_TEXT = "The last door swings open and daylight floods in. You have crossed the vault."
LOSE_TEXT = "{name} shakes their head. The lights go out and the attempt is over."

_EXAMPLE_OBS = ("A bare antechamber with whitewashed walls. A porter sits behind a desk and looks up as you "
                "enter.")
# The example's lesson, in the layout the library renders (``slea.experience.retrieval``: header, "Do:", one line
# per strategy; tests/envs/test_recall.py checks it against a real render). It names the second listed gesture, so
# following it is not the same as answering the first one listed.
_EXAMPLE_LESSON = ("Lessons from earlier episodes (hints; use them only if they fit):\nDo:\n"
                   "- 'shrug' earned the reward on this kind of task.")
INSTRUCTIONS = Instructions(
    system="You are crossing a vault of chambers. In each chamber its warden lets you pass only after the right "
    "gesture. Reply with exactly one gesture copied from the list of valid gestures, and nothing else.",
    example=((user_turn("Greet the porter of the antechamber.", _EXAMPLE_OBS, ["nod", "shrug"],
                        cue="Your gesture:"), "nod"),),
    answer_cue="Your gesture:",
    # rollout.experience_in: user — the example shows a lesson in the user turn and follows it
    example_with_experience=((user_turn("Greet the porter of the antechamber.", _EXAMPLE_OBS, ["nod", "shrug"],
                                        cue="Your gesture:", experience=_EXAMPLE_LESSON), "shrug"),),
)


def chance(gestures: int = len(GESTURES), chambers: int = 3) -> float:
    """The win probability of a uniformly random valid gesture in every chamber: ``(1/A)^k``."""
    return (1.0 / gestures) ** chambers


@dataclass(frozen=True)
class Chamber:
    kind: str  # the chamber type (a key of RIGHT)
    name: str
    thing: str
    order: tuple[str, ...]  # the admissible gestures in the order listed

    @property
    def text(self) -> str:
        desc = dict(CHAMBERS)[self.kind]
        return desc.format(name=self.name, thing=self.thing)

    @property
    def right(self) -> str:
        return RIGHT[self.kind]


def generate_game(split: str, game: int, chambers: int = 3, kinds: tuple[str, ...] | None = None
                  ) -> tuple[Chamber, ...]:
    """Game ``game`` of ``split``: ``chambers`` distinct chamber types (of ``kinds``, default all) in a random
    order, each with a name and an object from the split's pools and its own shuffled gesture list.
    Deterministic in (split, game)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    kinds = tuple(kinds) if kinds is not None else tuple(k for k, _ in CHAMBERS)
    if not 1 <= chambers <= len(kinds):
        raise ValueError(f"chambers must be in 1..{len(kinds)}, got {chambers}")
    rng = random.Random(f"recall/{split}/{int(game)}")
    picked = rng.sample(kinds, chambers)
    names = rng.sample(NAMES[split], chambers)
    things = rng.sample(THINGS[split], chambers)
    out = []
    for kind, name, thing in zip(picked, names, things):
        order = list(GESTURES)
        rng.shuffle(order)
        out.append(Chamber(kind, name, thing, tuple(order)))
    return tuple(out)


_WORD = re.compile(r"[a-z]+")


def _template(text: str) -> re.Pattern[str]:
    """A regex of a text with ``{name}``/``{thing}`` slots: the slots become named groups, the rest literal."""
    parts = re.split(r"\{(name|thing)\}", text)
    return re.compile("".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>.+?)" for i, p in enumerate(parts)))


# The visible texts a game shows, as patterns: each chamber type's description, the lost and the won text.
_CHAMBER_TEXTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((kind, _template(desc)) for kind, desc in CHAMBERS)
_LOSE_TEXT = _template(LOSE_TEXT)


def chamber_key(observation: str) -> StateKey | None:
    """Recall's state key of an observation (:meth:`RecallEnv.state_key`): the chamber type (``<type> chamber:
    the warden and the object``), the warden's refusal (``the warden refused the gesture``) or the crossed
    vault; the warden's name and the object are the slots ``warden`` and ``object``. None for any other text."""
    for kind, pattern in _CHAMBER_TEXTS:
        m = pattern.fullmatch(observation.strip())
        if m is not None:
            return StateKey(f"{kind} chamber: the warden and the object",
                            {"warden": m["name"], "object": m["thing"]})
    m = _LOSE_TEXT.fullmatch(observation.strip())
    if m is not None:
        return StateKey("the warden refused the gesture: the attempt is over", {"warden": m["name"]})
    if observation.strip() == WIN_TEXT:
        return StateKey("the vault is crossed")
    return None


class RecallEnv(TextEnv):
    """The Recall vault (module docstring).

    Args:
        split: ``"train"`` or ``"heldout"`` (disjoint name and object pools; same chamber types and gestures).
        num_games: if set, ``reset(seed=k)`` plays game ``k % num_games`` (a finite task set).
        chambers: k, chambers per game (1..S).
        kinds: the chamber types games draw from (default: all of :data:`CHAMBERS`).
    """

    task_type = "recall"
    snapshots = "exact"
    instructions = INSTRUCTIONS
    expert_source = "walkthrough"  # info["walkthrough"]: the right gestures of the game

    def __init__(self, split: str = "train", num_games: int | None = None, chambers: int = 3,
                 kinds: list[str] | tuple[str, ...] | None = None) -> None:
        super().__init__()
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if num_games is not None and int(num_games) < 1:
            raise ValueError("num_games must be >= 1")
        known = {k for k, _ in CHAMBERS}
        if kinds is not None and (not kinds or set(kinds) - known):
            raise ValueError(f"kinds must be a non-empty subset of {sorted(known)}, got {kinds!r}")
        self.split = split
        self.num_games = None if num_games is None else int(num_games)
        self.kinds = tuple(kinds) if kinds is not None else None
        self.chambers = int(chambers)
        if not 1 <= self.chambers <= len(self.kinds or known):
            raise ValueError(f"chambers must be in 1..{len(self.kinds or known)}, got {chambers}")
        self._goal = GOAL
        self._game: int | None = None
        self._rooms: tuple[Chamber, ...] = ()
        self._pos = 0
        self._won = self._lost = False

    # -- the contract ---------------------------------------------------------------------------------------
    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        game = self._pick(self.num_games, seed, options)
        self._game = game
        self._rooms = generate_game(self.split, game, self.chambers, self.kinds)
        self._pos = 0
        self._won = self._lost = False
        self._admissible = list(self._rooms[0].order)
        return self._rooms[0].text, {}

    def _step(self, action: str) -> StepResult:
        if not self._rooms:
            return self._reject("Call reset() before step().")
        if self._won or self._lost:
            return self._reject("The attempt is over.")
        words = _WORD.findall(action.lower())
        gesture = words[0] if len(words) == 1 and words[0] in GESTURES else None
        if gesture is None:
            return self._reject("Not a gesture: answer with one gesture from the list.")
        room = self._rooms[self._pos]
        if gesture != room.right:
            self._lost = True
            self._admissible = []
            return LOSE_TEXT.format(name=room.name), 0.0, True, False, {"invalid": False}
        self._pos += 1
        reward = 1.0 / self.chambers
        if self._pos == len(self._rooms):
            self._won = True
            self._admissible = []
            return WIN_TEXT, reward, True, False, {"invalid": False}
        self._admissible = list(self._rooms[self._pos].order)
        return self._rooms[self._pos].text, reward, False, False, {"invalid": False}

    def _info_defaults(self) -> dict[str, Any]:
        room = self._rooms[self._pos] if self._rooms and self._pos < len(self._rooms) else None
        return {"won": self._won, "lost": self._lost, "game": self._game, "chamber": self._pos,
                "kind": room.kind if room is not None and not (self._won or self._lost) else "",
                "walkthrough": [r.right for r in self._rooms]}

    def state_key(self, observation: str) -> StateKey | None:
        """The chamber type this observation describes, recognised from the type's fixed description (the text
        the agent reads), with the warden's name and the object as slots. Keeps: the type, or that the attempt
        was refused or won. Drops: the names and objects of the game (held-out games draw them from other
        pools). Never reads the right gesture or the game's hidden rooms. Example: ``library chamber: the warden
        and the object`` with ``{"warden": "Jory", "object": "a folded map"}``."""
        return chamber_key(observation)

    # -- snapshots ------------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        if not self._rooms:
            raise RuntimeError("get_state() before reset()")
        return {"game": self._game, "rooms": self._rooms, "pos": self._pos, "won": self._won, "lost": self._lost,
                "admissible": list(self._admissible or []), "last_obs": self._last_obs}

    def set_state(self, state: dict[str, Any]) -> None:
        self._game, self._rooms, self._pos = state["game"], tuple(state["rooms"]), int(state["pos"])
        self._won, self._lost = bool(state["won"]), bool(state["lost"])
        self._admissible = list(state["admissible"])
        self._last_obs = state["last_obs"]

    def render(self) -> str:
        return self._last_obs


register(
    "slea/Recall-v0",
    "slea.envs.recall:RecallEnv",
    family="recall",
    description="Recall: a positive control for experience retrieval (recurring chambers, one arbitrary right "
                "gesture each)",
)
