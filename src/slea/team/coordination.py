"""Coordination team tasks: positive controls for sequential multi-agent fine-tuning (TeamTR).

* ``ballot_volunteer`` — four members vote in turn on private ballots of ``slea/Ballot-v0`` (a volunteer's
  dilemma: exactly one must take the chore on). Every member acts: its message is its vote. The transcript shows
  the words said but not what they meant (each ballot has its own words, listed only to its voter), so a
  member's best response depends on the others' current policies, not on what it reads. The roles differ only in
  their names: an untrained team is symmetric, and only updates that see each other's effect (fresh rollouts
  after every single-member update) can break the symmetry into a convention.

Registered in :data:`slea.team.tasks.TEAM_TASKS` (this module is one of its built-in modules).
"""

from __future__ import annotations

from slea.envs.ballot import BALLOT, GOAL
from slea.team.prompts import team_turn
from slea.team.tasks import Role, TeamTask, register_team_task

BALLOT_MEMBERS = ("ana", "ben", "cai", "dov")
_CUE = "Your vote:"
_GOAL = GOAL.format(chore="feed the cat")


def _member(name: str, n: int) -> Role:
    system = (f"You are {name.capitalize()}, one of {n} team members. A chore must be taken on by exactly one "
              f"member: if nobody takes it on, or more than one member does, the team fails. You vote on a "
              f"private ballot: reply with exactly one word copied from your list of valid commands, and nothing "
              f"else.")
    # two example votes, one per position, so the example sets no preference for either word
    example = ((team_turn(_GOAL, [f"[env] {BALLOT.format(j=1, n=n)}"], ["oak", "elm"], _CUE), "oak"),
               (team_turn(_GOAL, ["[env] " + BALLOT.format(j=1, n=n), "[other] fig",
                                  "[env] " + BALLOT.format(j=2, n=n)], ["yew", "ash"], _CUE), "ash"))
    return Role(name, system, acts=True, cue=_CUE, example=example)


@register_team_task("ballot_volunteer")
def ballot_volunteer() -> TeamTask:
    n = len(BALLOT_MEMBERS)
    return TeamTask("ballot_volunteer", tuple(_member(m, n) for m in BALLOT_MEMBERS), ("slea/Ballot-v0",),
                    "Ballot: four members, private ballots, exactly one must take the chore on (TeamTR control)")
