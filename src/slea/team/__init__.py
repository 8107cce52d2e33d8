"""Teams of agents sharing one text context (TeamTR).

* :mod:`slea.team.context` — the shared context (messages of agents and env, in order);
* :mod:`slea.team.routers` — who speaks next (registry; ``round_robin`` by default);
* :mod:`slea.team.tasks` — team tasks: roles and role prompts on slea's envs (registry);
* :mod:`slea.team.prompt_builder` — an agent's prompt from its role and the shared context;
* :mod:`slea.team.policy` — n agents as LoRA adapters on one shared base model (torch, peft);
* :mod:`slea.team.rollout` — team episodes over an :class:`slea.envs.pool.EnvPool`.

Importing this package loads only the light parts (no torch).
"""

from __future__ import annotations

from slea.team.context import ENV, Message, SharedContext
from slea.team.routers import ROUTERS, get_router, register_router, round_robin, route
from slea.team.tasks import TEAM_TASKS, Role, TeamTask, get_team_task, register_team_task

__all__ = ["ENV", "ROUTERS", "TEAM_TASKS", "Message", "Role", "SharedContext", "TeamTask", "get_router",
           "get_team_task", "register_router", "register_team_task", "round_robin", "route"]
