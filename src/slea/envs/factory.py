"""The one way slea builds an env pool from config: :func:`make_pool`; and the held-out env's constructor
arguments, :func:`eval_env_kwargs`.

Training, evaluation, alignment sampling and team runs all build their pools here, so ``env.workers`` (local
processes or Ray actors) and the fault guards (``env.step_timeout_s``, ``env.reset_timeout_s``) apply everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slea.envs.pool import EnvPool

if TYPE_CHECKING:
    from slea.config import EnvSection


def make_pool(env_cfg: EnvSection, num_groups: int, group_size: int,
              env_kwargs: Mapping[str, Any] | None = None) -> EnvPool:
    """The pool ``env_cfg`` (an ``env:`` config section) asks for: its ``workers`` (local or Ray actors), its
    fault timeouts, and ``env_kwargs`` (default: ``env_cfg.kwargs``). ``env.workers: ray`` without the ``ray``
    package is a :class:`slea.config.ConfigError`."""
    kwargs = dict(env_cfg.kwargs if env_kwargs is None else env_kwargs)
    guards: dict[str, Any] = {"step_timeout_s": env_cfg.step_timeout_s, "reset_timeout_s": env_cfg.reset_timeout_s}
    if env_cfg.workers == "ray":
        from slea.config import ConfigError
        from slea.envs.ray_pool import RayEnvPool, import_ray

        try:
            import_ray()
        except ImportError as exc:
            raise ConfigError(str(exc)) from None
        return RayEnvPool(env_cfg.id, num_groups, group_size, kwargs, num_workers=env_cfg.num_workers,
                          ray_cpus=env_cfg.ray_cpus, **guards)
    return EnvPool(env_cfg.id, num_groups, group_size, kwargs, **guards)


def eval_env_kwargs(env_cfg: EnvSection, split: str = "heldout") -> dict[str, Any]:
    """The constructor arguments of an evaluation env: ``env_cfg.kwargs`` (the training env's), ``split`` (default
    ``heldout``), then ``env_cfg.eval_kwargs`` over both (a ``split`` there wins). Training's held-out evaluation,
    a team's, ``slea eval``, ``slea agent`` and alignment's evaluations all build their envs with it."""
    return {**env_cfg.kwargs, "split": split, **env_cfg.eval_kwargs}
