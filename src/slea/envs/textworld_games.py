"""TextWorld games: task specs, split seeds and the disk cache of games generated offline from seeds
(the env that plays them is slea/envs/textworld.py).

Task specs
----------
A task set is a list of *task specs*, strings of the form ``<challenge>:<value>[:<opt>[,<opt>...]]``, where
each ``opt`` is ``key=value`` or a bare flag (``open`` means ``open=true``). The challenges are the four of
``textworld.challenges``:

=====================================  ==================================================================
``coin_collector:<level>``             level 1-300 (1-100 no distractor rooms, then more distractors)
``treasure_hunter:<level>``            level 1-30 (a distractor object: taking it loses the game)
``simple:<rewards>[:goal=..,test]``    rewards dense | balanced | sparse; goal detailed (default) | brief
                                       | none; ``test`` draws from the challenge's test distribution
``cooking:<recipe>[:opts]``            recipe = number of ingredients; opts ``take=N`` (ingredients to
                                       find, default = recipe), ``go=1|6|9|12`` (rooms, default 1),
                                       flags ``open``, ``cook``, ``cut``, ``drop``, ``recipe_seed=N``,
                                       ``split=train|valid|test`` (cooking's own food split)
=====================================  ==================================================================

Examples: ``"coin_collector:1"``, ``"treasure_hunter:2"``, ``"simple:dense"``, ``"cooking:1"``,
``"cooking:2:cook,cut,go=6,open"``. Specs are canonicalised (options sorted, defaults dropped), so
``"simple:dense:goal=detailed"`` and ``"simple:dense"`` name the same games.

Splits and seeds
----------------
A split holds ``num_games`` games. Game ``i`` of a split uses spec ``tasks[i % len(tasks)]`` and generation
seed ``SPLIT_SEED_BASE[split] + i`` (train 1000+, heldout 5000+; at most 4000 games per split, so the seed
ranges never overlap). ``reset(seed=k)`` plays game ``k % num_games``, so the G copies of a task group that
are reset with the same seed play the same game; ``reset(options={"game": i})`` picks game ``i`` directly.

Cache
-----
Games are generated with ``textworld.challenges.<challenge>.make`` + ``compile_game`` and cached as
``<cache_dir>/<spec>/<seed>.z8`` (plus the ``.json`` the engine needs beside it). ``cache_dir`` defaults to
``$SLEA_CACHE_DIR/textworld`` or ``~/.cache/slea/textworld``. Generation is deterministic in (spec, seed),
byte for byte: it runs in a child interpreter with ``PYTHONHASHSEED=0`` (textworld's generators iterate over
sets of strings, so in-process generation would depend on the parent's hash seed). A game is generated in a private temporary folder under an exclusive file lock on its spec folder and moved
into place with atomic renames (``.json`` first, ``.z8`` last: a present ``.z8`` means a complete game), so
concurrent processes never see or write a half-made game. :func:`prepare_games` makes a whole split up front.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

CHALLENGES = ("coin_collector", "treasure_hunter", "simple", "cooking")
SPLIT_SEED_BASE = {"train": 1000, "heldout": 5000}
MAX_GAMES_PER_SPLIT = 4000
DEFAULT_TASKS = (
    "coin_collector:1",
    "coin_collector:2",
    "coin_collector:3",
    "coin_collector:4",
    "treasure_hunter:1",
    "treasure_hunter:2",
    "treasure_hunter:3",
)
_ALIASES = {
    "coin": "coin_collector",
    "treasure": "treasure_hunter",
    "tw-coin_collector": "coin_collector",
    "tw-treasure_hunter": "treasure_hunter",
    "tw-simple": "simple",
    "tw-cooking": "cooking",
}

# How many games this process generated / found in the cache (tests and start-up logs read it).
GENERATION_STATS: Counter[str] = Counter()


# ------------------------------------------------------------------------------------------------------
# Task specs
# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSpec:
    """A parsed, canonical task spec: a challenge and its settings (see the module docstring)."""

    challenge: str
    value: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def canonical(self) -> str:
        opts = []
        for key, val in self.options:
            opts.append(key if val is True else f"{key}={val}")
        return f"{self.challenge}:{self.value}" + (":" + ",".join(opts) if opts else "")

    @property
    def dirname(self) -> str:
        """A file-system safe folder name for the cache (``coin_collector-1``, ``cooking-2-cook+go=6``)."""
        name = self.canonical.replace(":", "-").replace(",", "+")
        return re.sub(r"[^A-Za-z0-9_.=+-]", "_", name)

    def settings(self) -> dict[str, Any]:
        """The ``settings`` mapping the challenge's ``make`` expects."""
        opts = dict(self.options)
        if self.challenge in ("coin_collector", "treasure_hunter"):
            return {"level": int(self.value)}
        if self.challenge == "simple":
            return {
                "rewards": self.value,
                "goal": opts.get("goal", "detailed"),
                "test": bool(opts.get("test")),
            }
        recipe = int(self.value)
        return {
            "recipe": recipe,
            "take": int(opts.get("take", recipe)),
            "go": int(opts.get("go", 1)),
            "open": bool(opts.get("open")),
            "cook": bool(opts.get("cook")),
            "cut": bool(opts.get("cut")),
            "drop": bool(opts.get("drop")),
            "recipe_seed": int(opts.get("recipe_seed", 0)),
            "split": opts.get("split"),
        }

    def __str__(self) -> str:
        return self.canonical


_OPTION_DEFAULTS: dict[str, dict[str, Any]] = {
    "coin_collector": {},
    "treasure_hunter": {},
    "simple": {"goal": "detailed", "test": False},
    "cooking": {
        "take": None,
        "go": 1,
        "open": False,
        "cook": False,
        "cut": False,
        "drop": False,
        "recipe_seed": 0,
        "split": None,
    },
}
_OPTION_CHOICES: dict[str, tuple[Any, ...]] = {
    "goal": ("detailed", "brief", "none"),
    "go": (1, 6, 9, 12),
    "split": ("train", "valid", "test"),
}


def _parse_value(raw: str) -> Any:
    low = raw.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if re.fullmatch(r"-?\d+", low):
        return int(low)
    return low


def parse_task_spec(spec: str | TaskSpec) -> TaskSpec:
    """Parse and validate a task spec string (see the module docstring); raise ``ValueError`` if bad."""
    if isinstance(spec, TaskSpec):
        return spec
    parts = [p.strip() for p in str(spec).strip().split(":")]
    if len(parts) < 2 or len(parts) > 3 or not parts[1]:
        raise ValueError(f"task spec {spec!r}: expected '<challenge>:<value>[:<opt>,...]'")
    challenge = _ALIASES.get(parts[0].lower(), parts[0].lower())
    if challenge not in CHALLENGES:
        raise ValueError(
            f"task spec {spec!r}: unknown challenge {parts[0]!r}; known: {', '.join(CHALLENGES)}"
        )
    value = parts[1].lower()
    if challenge in ("coin_collector", "treasure_hunter", "cooking"):
        if not value.isdigit():
            raise ValueError(f"task spec {spec!r}: {challenge} needs an integer, got {value!r}")
        n = int(value)
        top = {"coin_collector": 300, "treasure_hunter": 30, "cooking": 5}[challenge]
        if not 1 <= n <= top:
            raise ValueError(f"task spec {spec!r}: {challenge} value must be in 1..{top}")
        value = str(n)
    elif value not in ("dense", "balanced", "sparse"):
        raise ValueError(f"task spec {spec!r}: simple needs dense|balanced|sparse, got {value!r}")

    defaults = _OPTION_DEFAULTS[challenge]
    opts: dict[str, Any] = {}
    if len(parts) == 3 and parts[2]:
        for item in parts[2].split(","):
            item = item.strip()
            if not item:
                continue
            key, eq, raw = item.partition("=")
            key = key.strip().lower().replace("-", "_")
            val = _parse_value(raw) if eq else True
            if key not in defaults:
                allowed = ", ".join(defaults) or "none"
                raise ValueError(
                    f"task spec {spec!r}: unknown option {key!r} for {challenge} (allowed: {allowed})"
                )
            if key in _OPTION_CHOICES and val not in _OPTION_CHOICES[key]:
                raise ValueError(f"task spec {spec!r}: {key} must be one of {_OPTION_CHOICES[key]}")
            if key in ("take", "recipe_seed") and not (isinstance(val, int) and not isinstance(val, bool)):
                raise ValueError(f"task spec {spec!r}: {key} must be an integer")
            opts[key] = val
    if challenge == "cooking":
        if opts.get("take") == int(value):
            opts.pop("take")  # the default
        if opts.get("take", 0) > int(value):
            raise ValueError(f"task spec {spec!r}: take must be <= recipe")
    canon = tuple(sorted((k, v) for k, v in opts.items() if v != defaults[k]))
    return TaskSpec(challenge, value, canon)


def game_seed(split: str, index: int) -> int:
    """The generation seed of game ``index`` of ``split`` (train 1000+, heldout 5000+)."""
    if split not in SPLIT_SEED_BASE:
        raise ValueError(f"split must be one of {tuple(SPLIT_SEED_BASE)}, got {split!r}")
    if not 0 <= index < MAX_GAMES_PER_SPLIT:
        raise ValueError(f"game index {index} outside 0..{MAX_GAMES_PER_SPLIT - 1}")
    return SPLIT_SEED_BASE[split] + index


def split_games(tasks: Sequence[str | TaskSpec], split: str, num_games: int) -> list[tuple[TaskSpec, int]]:
    """The (spec, seed) of every game of a split, in game-index order."""
    specs = [parse_task_spec(t) for t in tasks]
    if not specs:
        raise ValueError("tasks must name at least one task spec")
    if not 1 <= num_games <= MAX_GAMES_PER_SPLIT:
        raise ValueError(f"num_games must be in 1..{MAX_GAMES_PER_SPLIT}")
    return [(specs[i % len(specs)], game_seed(split, i)) for i in range(num_games)]


# ------------------------------------------------------------------------------------------------------
# Generation and the on-disk cache
# ------------------------------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """``$SLEA_CACHE_DIR/textworld`` if set, else ``~/.cache/slea/textworld``."""
    root = os.environ.get("SLEA_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "slea"
    return base / "textworld"


def game_path(spec: str | TaskSpec, seed: int, cache_dir: str | Path | None = None) -> Path:
    """Where game (spec, seed) lives in the cache (it may not exist yet)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / parse_task_spec(spec).dirname / f"{int(seed)}.z8"


def _is_complete(z8: Path) -> bool:
    return z8.is_file() and z8.with_suffix(".json").is_file()


_CHALLENGE_MODULES = {
    "coin_collector": "textworld.challenges.tw_coin_collector.coin_collector",
    "treasure_hunter": "textworld.challenges.tw_treasure_hunter.treasure_hunter",
    "simple": "textworld.challenges.tw_simple.simple",
    "cooking": "textworld.challenges.tw_cooking.cooking",
}

# Run in a child interpreter with PYTHONHASHSEED=0: textworld's generators iterate over sets of strings, so
# in-process generation depends on the parent's hash seed (the same seed then gives a different file, and
# can give a different game). The child also keeps textworld's global RNG state out of the trainer.
_GEN_SCRIPT = r"""
import importlib, json, sys
import textworld
from textworld.generator import compile_game
for job in json.load(sys.stdin):
    options = textworld.GameOptions()
    options.seeds = job["seed"]
    options.path = job["out"]
    options.file_ext = ".z8"
    options.force_recompile = True
    game = importlib.import_module(job["module"]).make(job["settings"], options)
    compile_game(game, options)
    print("made", job["out"], flush=True)
"""


def _generate(jobs: list[tuple[TaskSpec, int, Path]]) -> None:
    """Generate and compile games (spec, seed, output .z8 path) in one child process."""
    payload = [
        {
            "module": _CHALLENGE_MODULES[spec.challenge],
            "settings": spec.settings(),
            "seed": int(seed),
            "out": str(out),
        }
        for spec, seed, out in jobs
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", _GEN_SCRIPT],
        input=json.dumps(payload),
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120 + 60 * len(jobs),
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "")[-2000:]
        raise RuntimeError(f"TextWorld game generation failed (exit {proc.returncode}):\n{tail}")


def ensure_games(
    games: Sequence[tuple[str | TaskSpec, int]], cache_dir: str | Path | None = None
) -> list[Path]:
    """Return the paths of games (spec, seed), generating the missing ones first, all in one child process.

    Each spec folder is locked (in sorted order, so concurrent callers cannot deadlock) while its missing
    games are made in a private temporary folder and renamed into place (``.json`` first, ``.z8`` last).
    """
    paths = [game_path(spec, seed, cache_dir) for spec, seed in games]
    complete = [_is_complete(z8) for z8 in paths]
    GENERATION_STATS["reused"] += sum(complete)
    missing = {(parse_task_spec(spec), int(seed)) for (spec, seed), ok in zip(games, complete) if not ok}
    if not missing:
        return paths
    folders = sorted({game_path(spec, seed, cache_dir).parent for spec, seed in missing})
    with contextlib.ExitStack() as stack:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            stack.enter_context(FileLock(folder / ".lock"))
        todo = []  # still missing now that we hold the locks (another process may have made some)
        for spec, seed in sorted(missing, key=lambda g: (g[0].canonical, g[1])):
            z8 = game_path(spec, seed, cache_dir)
            if _is_complete(z8):
                GENERATION_STATS["reused"] += 1
            else:
                todo.append((spec, seed, z8))
        if todo:
            tmps = {
                f: Path(tempfile.mkdtemp(prefix=".tmp-", dir=f)) for f in {z8.parent for _, _, z8 in todo}
            }
            try:
                _generate([(spec, seed, tmps[z8.parent] / z8.name) for spec, seed, z8 in todo])
                for _, _, z8 in todo:
                    out = tmps[z8.parent] / z8.name
                    os.replace(out.with_suffix(".json"), z8.with_suffix(".json"))
                    os.replace(out, z8)  # last: a present .z8 means a complete game
            finally:
                for tmp in tmps.values():
                    shutil.rmtree(tmp, ignore_errors=True)
            GENERATION_STATS["generated"] += len(todo)
    return paths


def ensure_game(spec: str | TaskSpec, seed: int, cache_dir: str | Path | None = None) -> Path:
    """Return the path of game (spec, seed), generating and caching it first if needed."""
    return ensure_games([(spec, seed)], cache_dir)[0]


def prepare_games(
    tasks: Sequence[str | TaskSpec] = DEFAULT_TASKS,
    split: str = "train",
    num_games: int = 16,
    cache_dir: str | Path | None = None,
) -> list[Path]:
    """Generate (or reuse from the cache) every game of a split; return their paths in game-index order."""
    if isinstance(tasks, (str, TaskSpec)):
        tasks = [tasks]
    return ensure_games(split_games(tasks, split, num_games), cache_dir)
