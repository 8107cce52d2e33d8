"""Team tasks: the roles of a team on one of slea's environments, registered by name (``team.task``).

A :class:`Role` is one agent's part: its system prompt, whether its message is the environment action
(``acts``), its answer cue and an example exchange. Built in:

* ``textworld_planner_actor`` — TextWorld: the *planner* writes a one-line plan into the shared context, the
  *actor* issues the command (copied from the valid commands);
* ``textworld_solo_actor`` — the same TextWorld layout with the planner removed: one *actor* reads the
  transcript (observations and its own commands) and issues the command. A one-agent "team" (n = 1, the
  single-agent arm of the TeamTR comparison: the same env, prompt layout and trainer);
* ``searchqa_proposer_critic`` — Search-QA (Search-R1 protocol, exact-match reward: a checkable answer): the
  *proposer* proposes a search or an answer with a reason, the *critic* checks it against the retrieved
  information and submits the team's action (``<search>`` or ``<answer>``);
* ``ballot_volunteer`` (:mod:`slea.team.coordination`) — ``slea/Ballot-v0``: four members vote on private
  ballots, exactly one must take the chore on (the positive control for sequential fine-tuning).

Register your own with ``@register_team_task`` on a function returning a :class:`TeamTask` (or name it as
``"my_pkg.my_module:my_task"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from slea.plugins import Registry
from slea.team.context import Role
from slea.team.prompt_builder import team_turn as _turn

__all__ = ["TEAM_TASKS", "Role", "TeamTask", "get_team_task", "register_team_task"]


@dataclass(frozen=True)
class TeamTask:
    """The roles of a team, in router index order, and the env ids the task is written for."""

    name: str
    roles: tuple[Role, ...]
    env_ids: tuple[str, ...]
    summary: str = ""

    @property
    def agents(self) -> list[str]:
        return [r.name for r in self.roles]


TEAM_TASKS: Registry[TeamTask] = Registry("team task", ("slea.team.tasks", "slea.team.coordination"))


def register_team_task(name: str, *, replace: bool = False) -> Callable[[Callable[[], TeamTask]], Callable]:
    """Decorator: register the :class:`TeamTask` returned by the decorated function as ``name``."""
    return TEAM_TASKS.decorator(name, replace=replace, wrap=lambda fn: fn())


def get_team_task(name: str) -> TeamTask:
    """The team task registered as ``name``; :class:`KeyError` listing the known ones."""
    return TEAM_TASKS.get(name)


_TW_GOAL = "Your objective is to retrieve the coin from the floor of the pantry."
_TW_OBS = "[env] -= Pantry =- You've entered a pantry. There is an exit to the west. There is a coin on the floor."


@register_team_task("textworld_planner_actor")
def textworld_planner_actor() -> TeamTask:
    planner = Role(
        "planner",
        "You are the planner of a two-agent team playing a text adventure game. Read the goal and the team "
        "transcript, then write a one-line plan for the next move. The actor will type the command.",
        acts=False, cue="Your plan:",
        example=((_turn(_TW_GOAL, [_TW_OBS], None, "Your plan:"), "Take the coin."),))
    actor = Role(
        "actor",
        "You are the actor of a two-agent team playing a text adventure game. Follow the planner's plan: reply "
        "with exactly one command copied from the list of valid commands, and nothing else.",
        acts=True, cue="Your command:",
        example=((_turn(_TW_GOAL, [_TW_OBS, "[planner] Take the coin."], ["go west", "take coin"],
                        "Your command:"), "take coin"),))
    return TeamTask("textworld_planner_actor", (planner, actor), ("slea/TextWorld-v0",),
                    "TextWorld: a planner writes the plan, an actor issues the command")


@register_team_task("textworld_solo_actor")
def textworld_solo_actor() -> TeamTask:
    """``textworld_planner_actor`` without the planner: a single agent in the same prompt layout (the transcript
    holds the env's messages and its own), trained by the same :class:`slea.trainer.team.TeamTrainer` with
    n = 1. Every turn is an env move, so ``team.max_turns`` of k here matches 2k of the planner + actor team."""
    actor = Role(
        "actor",
        "You are playing a text adventure game alone. Read the goal and the transcript, then reply with exactly "
        "one command copied from the list of valid commands, and nothing else.",
        acts=True, cue="Your command:",
        example=((_turn(_TW_GOAL, [_TW_OBS], ["go west", "take coin"], "Your command:"), "take coin"),))
    return TeamTask("textworld_solo_actor", (actor,), ("slea/TextWorld-v0",),
                    "TextWorld: one actor alone (the single-agent arm of the planner + actor team)")


_QA_Q = "Who wrote the novel Dracula?"
_QA_OBS = f"[env] Question: {_QA_Q}"
_QA_CUE = "Your reply (<think>, then <search> or <answer>):"


@register_team_task("searchqa_proposer_critic")
def searchqa_proposer_critic() -> TeamTask:
    proposer = Role(
        "proposer",
        "You are the proposer of a two-agent question-answering team. Read the question and the information "
        "found so far, then propose in one line either a search query or an answer, with a short reason. The "
        "critic checks your proposal and submits the team's action.",
        acts=False, cue="Your proposal:",
        example=((_turn(_QA_Q, [_QA_OBS], None, "Your proposal:"),
                  "Search for the author of Dracula: nothing is known yet."),))
    critic = Role(
        "critic",
        "You are the critic of a two-agent question-answering team. Check the proposer's proposal against the "
        "information found so far. Reason inside <think> and </think>. If an answer is supported, submit it as "
        "<answer> ... </answer>; otherwise search for the missing evidence with <search> query </search>.",
        acts=True, cue=_QA_CUE,
        example=((_turn(_QA_Q, [_QA_OBS, "[proposer] Search for the author of Dracula: nothing is known yet."],
                        None, _QA_CUE),
                  "<think> No evidence yet, the search is right. </think>\n<search> Dracula novel author </search>"),))
    return TeamTask("searchqa_proposer_critic", (proposer, critic),
                    ("slea/SearchQA-v0", "slea/SearchQA-multi-v0", "slea/SearchQA-file-v0"),
                    "Search-QA: a proposer proposes, a critic checks and submits (exact-match reward)")
