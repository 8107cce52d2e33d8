"""Coordination team tasks: positive controls for sequential multi-agent fine-tuning (TeamTR).

* ``ballot_volunteer`` — four members vote in turn on private ballots of ``slea/Ballot-v0`` (a volunteer's
  dilemma: exactly one must take the chore on). Every member acts: its message is its vote. The transcript shows
  the word each said but not what it meant (each member's words are listed only to itself), so a member's best
  response depends on the others' current policies, not on what it reads. The roles differ only in their names and
  words; updates that see each other's effect (fresh rollouts after every single-member update) can turn the team into
  a convention, updates on stale rollouts move every member the same way.

Registered in :data:`slea.team.tasks.TEAM_TASKS` (this module is one of its built-in modules).
"""

from __future__ import annotations

from slea.envs.ballot import BALLOT, GOAL, VOTES
from slea.team.prompt_builder import team_turn
from slea.team.tasks import Role, TeamTask, register_team_task

BALLOT_MEMBERS = ("ana", "ben", "cai", "dov")
_CUE = "Your vote:"
_GOAL = GOAL.format(chore="feed the hens")  # no member's word in it


def _member(name: str, n: int, words: tuple[str, str]) -> Role:
    system = (f"You are {name.capitalize()}, one of {n} team members. Exactly one member must take on the chore. "
              f"Vote with exactly one word copied from your list, and nothing else.")
    # two example votes on the member's own list, one per position: the examples teach the form, not a preference.
    # (Examples on a made-up list were copied: the untrained model answered their words in 11 of 64 votes.)
    turn = team_turn(_GOAL, [f"[env] {BALLOT.format(j=1, n=n)}"], list(words), _CUE)
    return Role(name, system, acts=True, cue=_CUE, example=((turn, words[0]), (turn, words[1])))


@register_team_task("ballot_volunteer")
def ballot_volunteer() -> TeamTask:
    n = len(BALLOT_MEMBERS)
    roles = tuple(_member(m, n, VOTES[j]) for j, m in enumerate(BALLOT_MEMBERS))
    return TeamTask("ballot_volunteer", roles, ("slea/Ballot-v0",),
                    "Ballot: four members, private ballots, exactly one must take the chore on (TeamTR control)")
