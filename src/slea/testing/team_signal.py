"""A team algorithm for tests that always has a learning signal: a random tiny model never scores, so Eq.9 would
give every message advantage 0 and no update would move the weights. ``signal_algorithm(name)`` registers, for the
duration of the ``with`` block, an algorithm that needs a team and scores copy 0 of each task +1 and copy 1 −1."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from slea.algorithms.registry import ALGORITHMS, register_algorithm


@contextmanager
def signal_algorithm(name: str) -> Iterator[str]:
    @register_algorithm(name, level="trajectory", needs=("team",), defaults={"algorithm.policy_loss": "teamtr"})
    def signal(batch):
        return np.where(batch.traj_ids % 2 == 0, 1.0, -1.0)

    try:
        yield name
    finally:
        ALGORITHMS.remove(name)
