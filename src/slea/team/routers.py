"""Routers: which agent speaks next in a shared-context team.

A router is ``fn(turn, context, n_agents) -> agent index`` (``turn`` counts the episode's agent messages so far;
``context`` is its :class:`~slea.team.context.SharedContext`), registered by name like algorithms
(``team.router`` in the config; ``"my_pkg.my_module:my_router"`` or a ``plugins`` module for your own)::

    @register_router("critic_after_answers")
    def critic_after_answers(turn, context, n_agents):
        return 1 if "<answer>" in context.messages[-1].text else 0

TeamTR trains with the round-robin router (the TeamTR paper, §3), the default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from slea.plugins import Registry

if TYPE_CHECKING:
    from slea.team.context import SharedContext

Router = Callable[[int, "SharedContext", int], int]
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
