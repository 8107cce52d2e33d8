"""Helpers of the repository's ``bench/`` and ``experiments/`` scripts and their tests (folders of scripts, not
packages): importing a script, given its path, as a module, the rollout-shaped prompts the generation benches
share, and the ``transformers.generate`` baseline they time."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

# the admissible actions of every bench prompt (a TextWorld-like coin hunt)
ROLLOUT_ACTIONS = ["go east", "go west", "go north", "take coin", "open door", "take key", "unlock door with key"]
_ROOMS = ["a dark cellar", "a bright kitchen", "a dusty attic", "a small garden", "a long corridor"]
_THINGS = ["coin", "key", "apple"]  # what tasks 0-4, 5-9, 10-14 look for


def write_result(res: dict, out: Path) -> None:
    """Write a bench's result ``res`` as JSON to ``out`` (its folder made), then print its ``table`` and where it
    went."""
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(res["table"])
    print(f"wrote {out}")


def load_script(path: str | Path) -> ModuleType:
    """The script at ``path`` (a ``bench/`` or ``experiments/`` script, which are folders of scripts, not packages)
    as the module named for its file (registered in ``sys.modules``, so its dataclasses and pickled worker entry
    points resolve). The caller names the file: the installed package knows nothing of a repository's layout."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def rollout_prompts(builder, rng: random.Random, tasks: int, copies: int, later: bool, turns: int = 2,
                    observations: list[str] | None = None) -> list[list[int]]:
    """Token ids of ``tasks x copies`` TextWorld prompts built by ``builder`` (a :class:`PromptBuilder`), task by
    task (distinct goals for up to 15 tasks). Turn 0 (``later=False``): the copies of a task are identical, as a
    group's first turn is. Later turns: each copy gets ``turns`` random past (observation, action) pairs drawn
    from ``rng`` (``builder.history`` of them are shown), so histories differ. ``observations``: real
    observations to take task t's current one (the t-th) and the past ones from, instead of one-line stand-ins."""
    from slea.envs.textworld import INSTRUCTIONS as TEXTWORLD

    out = []
    for t in range(tasks):
        room = _ROOMS[t % len(_ROOMS)]
        goal = f"Find the {_THINGS[t // len(_ROOMS) % len(_THINGS)]} hidden in {room}."
        obs = (f"You are in {room}. There are exits to the east and north. " * 2 if observations is None
               else observations[t % len(observations)])
        for _ in range(copies):
            past = ([(rng.choice(observations) if observations else f"You were in {rng.choice(_ROOMS)}.",
                      rng.choice(ROLLOUT_ACTIONS)) for _ in range(turns)] if later else [])
            out.append(builder.build(TEXTWORLD, goal, obs, ROLLOUT_ACTIONS, past))
    return out


def hf_generate(model, tok, batch: list[list[int]], max_new: int, dtype: str, *, temperature: float = 1.0,
                stop_ids=()) -> list[list[int]]:
    """``transformers.generate`` over the left-padded ``batch`` (bf16 autocast when ``dtype`` says so), sampling
    at ``temperature`` with no top-k (0: greedy). A row stops at EOS or at a token of ``stop_ids``. Returns each
    row's new tokens up to and including the one that stopped it (as :class:`slea.policy.generation.Generation`
    ids are)."""
    import torch

    from slea.policy.generation import autocast, left_pad

    ids, mask = left_pad(batch, tok.pad_token_id)
    stops = sorted({tok.eos_token_id, *stop_ids})
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {
        "do_sample": False}
    with torch.no_grad(), autocast(dtype):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                             pad_token_id=tok.pad_token_id, eos_token_id=stops, **sampling)
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        rows.append(row[:end])
    return rows
