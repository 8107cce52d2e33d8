"""Ballot (``slea/Ballot-v0``): a volunteer's dilemma on private ballots — the TeamTR positive control.

A chore must be taken on by exactly one of ``agents`` (n) team members. They vote in turn, one ballot each. Member
j has its own two words (:data:`VOTES`: member 1 ``red``/``blue``, member 2 ``cat``/``dog``, ...): the *first*
word on its list takes the chore on, the second leaves it to the others. The observation says that much but never
names the words; they appear only in the voter's own list of valid commands (``info["admissible_actions"]``). A
teammate reading the shared transcript sees "red" or "blue", never whose list put which first: no observation or
prompt of another member ever says what a vote meant. After the n-th ballot the count is announced; reward 1
(won) when exactly one member took the chore on, else 0.

Why this is a control for sequential multi-agent fine-tuning: member j's best response depends on the others'
*current* policies — take the chore when P(no one else takes it) > P(exactly one other does) — not on what it
reads. Updating every member on the same (stale) rollouts moves them all the same way (all towards "take" while
few take, all towards "leave" while many do) and overshoots the coordinated outcome; re-sampling after every
single-member update lets the next member answer the updated one. With p the probability that a member takes the
chore, n p (1 − p)^(n−1) is the team's success (:func:`success`): 1/4 for n = 4 members voting at random, at most
(1 − 1/n)^(n−1) = 0.42 for any symmetric policy, 1 for a convention in which one member takes it and the others
leave it (:func:`scripted`). Each member's words are common one-token words, the same in every game and split, so
what a member learns is a preference between its own two words.

Seeds: ``reset(seed=k)`` plays game ``k`` of the split (``k % num_games`` when set; ``options={"game": k}`` too):
the chore is a function of (split, game); training and held-out splits use disjoint chores. Anything not in the
current list is ``invalid`` (the ballot stays open). ``get_state()/set_state()`` are exact; ``info["walkthrough"]``
is :func:`scripted`'s answers (member 1 takes it on, the others leave it).

State key (:meth:`BallotEnv.state_key`): which ballot of how many is open, with the voter's own words as slots
(``ballot 2 of 4: the take word or the leave word`` with ``{"take word": "cat", "leave word": "dog", "chore":
"sweep the hall"}``), or the count's announcement; never the votes cast before or the hidden count.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from slea.envs.base import StepResult, TextEnv, register, user_turn
from slea.types import Instructions, StateKey

SPLITS = ("train", "heldout")
CHORES: dict[str, tuple[str, ...]] = {
    "train": ("fetch water from the well", "sweep the hall", "feed the goats", "mend the fence", "bake the bread",
              "wash the pots", "stack the firewood", "light the lamps", "weed the garden", "carry the mail"),
    "heldout": ("polish the bell", "patch the roof", "milk the cow", "clean the chimney", "shell the peas",
                "wind the clock", "air the blankets", "paint the gate"),
}
# per member: (takes the chore on, leaves it); common one-token words, meaningless to the other members
VOTES: tuple[tuple[str, str], ...] = (("red", "blue"), ("cat", "dog"), ("tea", "milk"), ("sun", "rain"),
                                      ("salt", "sand"), ("oak", "elm"))
GOAL = ("Exactly one member of the team must take on the chore: {chore}. If nobody takes it on, or more than one "
        "member does, the team fails.")
BALLOT = "Ballot {j} of {n}. The first word on your list takes the chore on, the second leaves it. Only you see your list."
RESULT = "All {n} ballots are in: {count} of {n} took the chore on. {verdict}"

INSTRUCTIONS = Instructions(
    system="You are one member of a team voting on a private ballot. Reply with exactly one word copied from your "
    "list of valid commands, and nothing else.",
    example=((user_turn(GOAL.format(chore="feed the cat"), BALLOT.format(j=1, n=3), ["up", "down"],
                        cue="Your vote:"), "up"),
             (user_turn(GOAL.format(chore="feed the cat"), BALLOT.format(j=1, n=3), ["up", "down"],
                        cue="Your vote:"), "down")),
    answer_cue="Your vote:",
)


def success(p: float, n: int) -> float:
    """The team's win probability when each of ``n`` members independently takes the chore on with probability
    ``p``: exactly one does, ``n p (1 − p)^(n−1)``."""
    return n * p * (1.0 - p) ** (n - 1)


REWARDS = ("exact", "graded")
_BALLOT = re.compile(r"Ballot (\d+) of (\d+)\. ")
_RESULT = re.compile(r"All (\d+) ballots are in: ")
_CHORE = re.compile(r"take on the chore: (.+?)\. If nobody")


def graded_reward(takes: int, n: int) -> float:
    """The ``graded`` reward of a count: ``1 − |takes − 1| / (n − 1)``. 1 when exactly one member took the chore on;
    nobody and two members score alike (1 − 1/(n−1)), and each member more than one costs another 1/(n−1), down to
    0 when all n took it. A member's best response still depends on the others (take it only when nobody else
    will), but a team that is wrong by one is told so, not only a team that is right."""
    return 1.0 - abs(int(takes) - 1) / (int(n) - 1)


def scripted(ballots: tuple[tuple[str, str], ...]) -> list[str]:
    """A convention that always wins: member 1 takes the chore on (first word), every other member leaves it."""
    return [pair[0] if j == 0 else pair[1] for j, pair in enumerate(ballots)]


@dataclass(frozen=True)
class Game:
    chore: str
    ballots: tuple[tuple[str, str], ...]  # per ballot: (takes it on, leaves it)


def generate_game(split: str, game: int, agents: int = 4) -> Game:
    """Game ``game`` of ``split``: a chore of the split; ballot j is member j's own words (:data:`VOTES`).
    Deterministic."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 2 <= agents <= len(VOTES):
        raise ValueError(f"agents must be in 2..{len(VOTES)}, got {agents}")
    rng = random.Random(f"ballot/{split}/{int(game)}")
    return Game(rng.choice(CHORES[split]), VOTES[:agents])


class BallotEnv(TextEnv):
    """The ballot game (module docstring).

    Args:
        split: ``"train"`` or ``"heldout"`` (disjoint chores and word pools).
        agents: n, the ballots of a game (one per team member).
        num_games: if set, ``reset(seed=k)`` plays game ``k % num_games``.
        reward: ``"exact"`` (1 when exactly one member took the chore on, else 0) or ``"graded"``
            (:func:`graded_reward`). Success (``won``) is exactly one in both.
    """

    task_type = "ballot"
    snapshots = "exact"
    instructions = INSTRUCTIONS
    expert_source = "walkthrough"

    def __init__(self, split: str = "train", agents: int = 4, num_games: int | None = None,
                 reward: str = "exact") -> None:
        super().__init__()
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if not 2 <= int(agents) <= len(VOTES):
            raise ValueError(f"agents must be in 2..{len(VOTES)}, got {agents}")
        if num_games is not None and int(num_games) < 1:
            raise ValueError("num_games must be >= 1")
        self.split, self.agents, self.reward = split, int(agents), reward
        self.num_games = None if num_games is None else int(num_games)
        self._game_id: int | None = None
        self._game: Game | None = None
        self._votes: list[str] = []
        self._takes = 0
        self._done = False

    def _observation(self) -> str:
        return BALLOT.format(j=len(self._votes) + 1, n=self.agents)

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        game = self._pick(self.num_games, seed, options)
        self._game_id, self._game = game, generate_game(self.split, game, self.agents)
        self._votes, self._takes, self._done = [], 0, False
        self._goal = GOAL.format(chore=self._game.chore)
        self._admissible = list(self._game.ballots[0])
        return self._observation(), {}

    def _step(self, action: str) -> StepResult:
        if self._game is None:
            return self._reject("Call reset() before step().")
        if self._done:
            return self._reject("The ballots are counted.")
        pair = self._game.ballots[len(self._votes)]
        word = action.strip().lower()
        if word not in pair:
            return self._reject("Not a word of your list: answer with one word from it.")
        self._votes.append(word)
        self._takes += word == pair[0]
        if len(self._votes) < self.agents:
            self._admissible = list(self._game.ballots[len(self._votes)])
            return self._observation(), 0.0, False, False, {"invalid": False}
        self._done, self._admissible = True, []
        won = self._takes == 1
        verdict = "Done: exactly one member took it on." if won else "The team failed."
        reward = graded_reward(self._takes, self.agents) if self.reward == "graded" else float(won)
        return RESULT.format(n=self.agents, count=self._takes, verdict=verdict), reward, True, False, {"invalid": False}

    def _info_defaults(self) -> dict[str, Any]:
        return {"won": self._done and self._takes == 1, "lost": self._done and self._takes != 1,
                "game": self._game_id, "ballot": len(self._votes), "takes": self._takes,
                "walkthrough": scripted(self._game.ballots) if self._game else []}

    def state_key(self, observation: str) -> StateKey | None:
        """Which ballot is open, read from the observation (``Ballot j of n``), with the voter's two words from its
        list of valid commands as the slots ``take word`` (listed first) and ``leave word``, and the goal's
        chore as ``chore``. Keeps: the ballot's position (member j's best vote depends on it under a
        convention). Drops: the words and the chore (the slots). After the last ballot: ``all n ballots are
        counted``, without the count. Example: ``ballot 2 of 4: the take word or the leave word`` with
        ``{"take word": "cat", "leave word": "dog", "chore": "sweep the hall"}``."""
        chore = _CHORE.search(self._goal)
        slots = {"chore": chore[1]} if chore else {}
        if (m := _BALLOT.match(observation)) is not None and len(self._admissible or []) == 2:
            take, leave = self._admissible  # type: ignore[misc]
            return StateKey(f"ballot {m[1]} of {m[2]}: the take word or the leave word",
                            {"take word": take, "leave word": leave, **slots})
        if (m := _RESULT.match(observation)) is not None:
            return StateKey(f"all {m[1]} ballots are counted", slots)
        return None

    def get_state(self) -> dict[str, Any]:
        if self._game is None:
            raise RuntimeError("get_state() before reset()")
        return {"game_id": self._game_id, "game": self._game, "votes": list(self._votes), "takes": self._takes,
                "done": self._done, "admissible": list(self._admissible or []), "goal": self._goal,
                "last_obs": self._last_obs}

    def set_state(self, state: dict[str, Any]) -> None:
        self._game_id, self._game = state["game_id"], state["game"]
        self._votes, self._takes, self._done = list(state["votes"]), int(state["takes"]), bool(state["done"])
        self._admissible, self._goal, self._last_obs = list(state["admissible"]), state["goal"], state["last_obs"]

    def render(self) -> str:
        return self._last_obs


register(
    "slea/Ballot-v0",
    "slea.envs.ballot:BallotEnv",
    family="ballot",
    description="Ballot: a volunteer's dilemma on private ballots (the TeamTR control; team task ballot_volunteer)",
)
