"""Shared fixtures of the env tests.

TextWorld games cost about 1 s each to generate (plus ~2 s to start the generator process), so the whole
session generates its games once, into one temporary cache: 2 train games and 1 held-out game.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

TW_TASKS = ["coin_collector:1", "treasure_hunter:1"]


@pytest.fixture(scope="session")
def tw_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("textworld")
    from slea.envs import textworld as tw

    cache: Path = tmp_path_factory.mktemp("tw-cache")
    games = tw.split_games(TW_TASKS, "train", 2) + tw.split_games(TW_TASKS, "heldout", 1)
    paths = tw.ensure_games(games, cache)  # one generator process for all three games
    return {"dir": cache, "tasks": TW_TASKS, "train": paths[:2], "heldout": paths[2:]}


@pytest.fixture
def tw_env(tw_cache: dict[str, Any]):
    from slea.envs import make

    env = make(
        "slea/TextWorld-v0", tasks=tw_cache["tasks"], split="train", num_games=2, cache_dir=tw_cache["dir"]
    )
    yield env
    env.close()
