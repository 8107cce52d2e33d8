"""EnvPool: N task groups x G identical env copies, stepped together (local and sequential).

Env ``i`` belongs to group ``i // group_size``. ``reset(seeds)`` takes one seed per group and resets all G
copies of group ``g`` with ``seeds[g]`` (so they play the same task); ``step(actions)`` steps only the envs
named in ``actions`` and refuses finished ones. Every single env call goes through :meth:`EnvPool.step_one`
(and :meth:`EnvPool.reset_one`), the one place to wrap with a per-step timeout or to send to a remote
worker later. Env cost is about 1% of an iteration, so sequential stepping is fine on a laptop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

import numpy as np

from slea.envs.base import StepResult, TextEnv, make


class EnvPool:
    """N×G text envs built with :func:`slea.envs.make`.

    Args:
        env_id: a registered id (``slea/TextWorld-v0``...).
        num_groups: N, the number of task groups.
        group_size: G, identical copies per group.
        env_kwargs: constructor arguments for every copy.
    """

    def __init__(
        self,
        env_id: str,
        num_groups: int,
        group_size: int,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if num_groups < 1 or group_size < 1:
            raise ValueError("num_groups and group_size must be >= 1")
        self.env_id = env_id
        self.num_groups = int(num_groups)
        self.group_size = int(group_size)
        self.env_kwargs = dict(env_kwargs or {})
        self.envs: list[TextEnv] = [make(env_id, **self.env_kwargs) for _ in range(self.size)]
        self.done = np.ones(self.size, dtype=bool)  # true until reset, and after termination/truncation
        self.seeds: list[int | None] = [None] * self.num_groups
        self.last: list[tuple[str, dict[str, Any]] | None] = [None] * self.size  # latest (obs, info) per env

    # -- layout ----------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.num_groups * self.group_size

    def __len__(self) -> int:
        return self.size

    def group_of(self, i: int) -> int:
        if not 0 <= i < self.size:
            raise IndexError(f"env index {i} outside 0..{self.size - 1}")
        return i // self.group_size

    def members(self, group: int) -> range:
        """The env indices of ``group``."""
        if not 0 <= group < self.num_groups:
            raise IndexError(f"group {group} outside 0..{self.num_groups - 1}")
        return range(group * self.group_size, (group + 1) * self.group_size)

    @property
    def group_ids(self) -> np.ndarray:
        return np.arange(self.size) // self.group_size

    def live(self) -> list[int]:
        """Indices of the envs whose episode is still running."""
        return [int(i) for i in np.flatnonzero(~self.done)]

    @property
    def all_done(self) -> bool:
        return bool(self.done.all())

    # -- the single-env calls (wrap these for timeouts / remote execution) --------------------------------
    def reset_one(self, i: int, seed: int | None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        return self.envs[i].reset(seed=seed, options=options)

    def step_one(self, i: int, action: str) -> StepResult:
        """Execute one env step. The only place an env is stepped: wrap it for a per-step timeout."""
        return self.envs[i].step(action)

    # -- batch API ---------------------------------------------------------------------------------------
    def reset(
        self, seeds: Sequence[int | None], options: Sequence[dict[str, Any] | None] | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """Reset every env; ``seeds[g]`` (and ``options[g]``) go to all copies of group ``g``."""
        if len(seeds) != self.num_groups:
            raise ValueError(f"reset needs {self.num_groups} seeds (one per group), got {len(seeds)}")
        if options is not None and len(options) != self.num_groups:
            raise ValueError(f"reset needs {self.num_groups} options (one per group), got {len(options)}")
        out: list[tuple[str, dict[str, Any]]] = []
        for i in range(self.size):
            g = i // self.group_size
            opts = dict(options[g]) if options is not None and options[g] else None
            obs, info = self.reset_one(i, seeds[g], opts)
            info = dict(info)
            info["group"] = g
            out.append((obs, info))
            self.last[i] = (obs, info)
        self.seeds = list(seeds)
        self.done[:] = False
        return out

    def step(self, actions: Mapping[int, str]) -> dict[int, StepResult]:
        """Step the envs named in ``actions`` (live ones only); return their results by index."""
        bad = [i for i in actions if not 0 <= i < self.size or self.done[i]]
        if bad:
            raise ValueError(f"cannot step finished or unknown envs {sorted(bad)}; live: {self.live()}")
        results: dict[int, StepResult] = {}
        for i in sorted(actions):
            obs, reward, terminated, truncated, info = self.step_one(i, actions[i])
            info = dict(info)
            info["group"] = i // self.group_size
            results[i] = (obs, reward, terminated, truncated, info)
            self.last[i] = (obs, info)
            if terminated or truncated:
                self.done[i] = True
        return results

    def mark_done(self, indices: Sequence[int]) -> None:
        """Retire envs from the current episode (e.g. the collector hit its max steps)."""
        for i in indices:
            self.done[i] = True

    # -- snapshots ---------------------------------------------------------------------------------------
    def get_state(self, i: int) -> Any:
        return self.envs[i].get_state()

    def set_state(self, i: int, state: Any) -> None:
        self.envs[i].set_state(state)
        self.done[i] = False

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
