"""Routers: which agent speaks next in a shared-context team.

A router is ``fn(turn, context, n_agents) -> agent index`` (``turn`` counts the episode's agent messages so far;
``context`` is its :class:`~slea.team.context.SharedContext`), registered by name like algorithms
(``team.router`` in the config; ``"my_pkg.my_module:my_router"`` or a ``plugins`` module for your own)::

    @register_router("critic_after_answers")
    def critic_after_answers(turn, context, n_agents):
        return 1 if "<answer>" in context.messages[-1].text else 0

TeamTR trains with the round-robin router (the TeamTR paper, §3), the default. ``retry_invalid`` is round-robin
except that an acting agent whose move the environment refused speaks again (a voter whose ballot is still open).
"""

from __future__ import annotations

from collections.abc import Callable

from slea.plugins import Registry
from slea.team.context import ENV, INVALID, SharedContext

Router = Callable[[int, SharedContext, int], int]
ROUTERS: Registry[Router] = Registry("router", ("slea.team.routers",))


def register_router(name: str, *, replace: bool = False) -> Callable[[Router], Router]:
    """Decorator: register ``fn(turn, context, n_agents) -> int`` as router ``name``."""
    return ROUTERS.decorator(name, replace=replace)


def get_router(name: str) -> Router:
    """The router registered as ``name`` (or ``"module:function"``); :class:`KeyError` listing the known ones."""
    return ROUTERS.get(name)


def route(router: Router, turn: int, context: SharedContext, n_agents: int) -> int:
    """``router``'s choice, checked: an index outside ``0..n_agents−1`` is a ``ValueError`` naming it."""
    agent = router(turn, context, n_agents)
    if not isinstance(agent, int) or not 0 <= agent < n_agents:
        raise ValueError(f"router {getattr(router, '__name__', router)!r} chose agent {agent!r}; "
                         f"expected an index in 0..{n_agents - 1}")
    return agent


@register_router("round_robin")
def round_robin(turn: int, context: SharedContext, n_agents: int) -> int:
    """Agents speak in turn: agent ``turn mod n`` (TeamTR's router R)."""
    return turn % n_agents


@register_router("retry_invalid")
def retry_invalid(turn: int, context: SharedContext, n_agents: int) -> int:
    """Round-robin, except that an agent whose move the environment answered as invalid speaks again: in a task
    where each agent owns one move of the environment (a ballot of ``slea/Ballot-v0``), the move stays with its
    owner instead of passing to the next agent. Without invalid moves it equals :func:`round_robin`."""
    spoken = [i for i, m in enumerate(context.messages) if m.agent >= 0]
    if not spoken:
        return 0
    last = context.messages[spoken[-1]]
    after = context.messages[spoken[-1] + 1:]
    if any(m.speaker == ENV and m.text.startswith(INVALID) for m in after):
        return last.agent
    return (last.agent + 1) % n_agents
