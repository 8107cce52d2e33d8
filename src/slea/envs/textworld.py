"""TextWorld games, generated offline from seeds and cached on disk (ids ``slea/TextWorld-v0`` and friends).

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

Observation, info, reward
-------------------------
The observation is the engine's text with the ASCII banner, the ``>`` prompt and status line (room, score,
moves) and the end-of-game ``RESTART/RESTORE`` menu removed, so identical states give identical anchors.
``info``: ``goal`` (objective), ``admissible_actions``, ``task_type`` (the challenge), ``won``, ``lost``,
``walkthrough`` (expert commands from the initial state), ``max_score``, ``score``, ``game`` (index in the
split), ``game_seed``, ``spec``, and ``invalid`` on steps. With ``drop_meta=True`` (default) ``look``,
``inventory`` and ``examine ...`` (except ``examine cookbook``, which the cooking games need) leave both the
admissible list and the walkthrough. ``reward="win"``: 1 on a win, else 0; ``reward="score"``: the score delta
divided by ``max_score``. The episode terminates on a win or a loss.

A command outside the admissible list does not reach the engine: the env answers the previous observation,
reward 0 and ``info["invalid"] = True`` (the rollout collector applies any penalty).

Snapshots
---------
``get_state()`` returns ``{"game": index, "game_seed": seed, "spec": spec, "actions": [...]}`` (the game and
the commands executed since reset; a small JSON-able dict); ``set_state(state)`` resets that game and replays
the commands (TextWorld games are deterministic): about 9 ms for the reset plus 3-4 ms per command.
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
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slea.envs.base import StepResult, TextEnv, register

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


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock across processes (and threads: each call opens its own description)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        try:
            import fcntl
        except ImportError:  # not POSIX: rely on the atomic renames alone
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


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
            stack.enter_context(_file_lock(folder / ".lock"))
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


# ------------------------------------------------------------------------------------------------------
# Observation cleaning
# ------------------------------------------------------------------------------------------------------
_BANNER_LINE = re.compile(r"^[ \t_|\\/$<>]*$")  # the TEXTWORLD ASCII banner (and blank lines)
_PROMPT_LINE = re.compile(r"^[ \t]*>.*$", re.MULTILINE)  # "> <padding> -= Room =-1/4": prompt + status line
_END_MENU = re.compile(r"^.*Would you like to RESTART, RESTORE.*$", re.MULTILINE)
_TURNS = re.compile(r", in \d+ turns?\.")


def clean_observation(text: str) -> str:
    """Strip the banner, prompt/status lines and the end menu; normalise blank lines and trailing spaces."""
    lines = (text or "").splitlines()
    i = 0
    while i < len(lines) and _BANNER_LINE.match(lines[i]):
        i += 1
    body = "\n".join(lines[i:])
    body = _PROMPT_LINE.sub("", body)
    body = _END_MENU.sub("", body)
    body = _TURNS.sub(".", body)
    body = "\n".join(_unindent(line) for line in body.splitlines())
    body = re.sub(r"\n{3,}", "\n\n", body)
    return body.strip()


def _unindent(line: str) -> str:
    """Drop trailing spaces, and the centring indentation of lines like ``*** The End ***``."""
    line = line.rstrip()
    return line.lstrip() if len(line) - len(line.lstrip()) > 8 else line


def _is_meta(command: str) -> bool:
    if command in ("look", "inventory", "l", "i"):
        return True
    return command.startswith("examine ") and command != "examine cookbook"


def normalize_command(action: str) -> str:
    """Lower-case, collapse spaces, drop surrounding quotes/backticks and a trailing period."""
    cmd = " ".join(str(action).lower().split())
    cmd = cmd.strip("\"'`")
    cmd = cmd.rstrip(".!").strip()
    return cmd


# ------------------------------------------------------------------------------------------------------
# The environment
# ------------------------------------------------------------------------------------------------------
class TextWorldEnv(TextEnv):
    """A TextWorld task set as a slea text env (see the module docstring for specs, splits, info, reward).

    Args:
        tasks: task specs (``"coin_collector:1"``...); game ``i`` uses ``tasks[i % len(tasks)]``.
        split: ``"train"`` (seeds 1000+) or ``"heldout"`` (seeds 5000+).
        num_games: games in the split; ``reset(seed=k)`` plays game ``k % num_games``.
        cache_dir: game cache (default ``$SLEA_CACHE_DIR/textworld`` or ``~/.cache/slea/textworld``).
        reward: ``"win"`` (1 on a win) or ``"score"`` (score delta / max score).
        drop_meta: hide ``look``, ``inventory`` and ``examine ...`` (not ``examine cookbook``).
        prepare: when to generate missing games: ``"on_miss"`` (default: the first reset that needs a missing
            game generates every missing game of the split, in one child process), ``True``/``"all"`` (in
            the constructor), ``False``/``"lazy"`` (only the game a reset needs).
        game_files: play these compiled games instead of generated ones (tasks/split are then ignored).
        goal_in_observation: keep the objective at the head of the first observation, as the engine prints
            it. Off by default: the goal is ``info["goal"]`` and the prompt shows it once already; repeated,
            it costs ~80 prompt tokens per step and pushes the room's exits past the observation clip.
    """

    def __init__(
        self,
        tasks: Sequence[str] = DEFAULT_TASKS,
        split: str = "train",
        num_games: int = 16,
        cache_dir: str | Path | None = None,
        reward: str = "win",
        drop_meta: bool = True,
        prepare: bool | str = "on_miss",
        game_files: Sequence[str | Path] | None = None,
        goal_in_observation: bool = False,
    ) -> None:
        super().__init__()
        if reward not in ("win", "score"):
            raise ValueError(f"reward must be 'win' or 'score', got {reward!r}")
        if isinstance(tasks, str):
            tasks = [tasks]
        self.split = split
        self.reward_mode = reward
        self.drop_meta = drop_meta
        self.goal_in_observation = goal_in_observation
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self._files: list[Path] | None = None
        if game_files is not None:
            self._files = [Path(f) for f in game_files]
            if not self._files:
                raise ValueError("game_files is empty")
            self._games: list[tuple[TaskSpec | None, int | None]] = [(None, None)] * len(self._files)
        else:
            self._games = list(split_games(tasks, split, num_games))
        self.num_games = len(self._games)
        self._paths: dict[int, Path] = {}  # games known to be in the cache
        modes = {True: "all", False: "lazy", "all": "all", "lazy": "lazy", "on_miss": "on_miss"}
        if prepare not in modes:
            raise ValueError(f"prepare must be one of 'on_miss', 'all', 'lazy' (or a bool), got {prepare!r}")
        self.prepare = modes[prepare]
        if self.prepare == "all" and self._files is None:
            ensure_games(self._games, self.cache_dir)  # type: ignore[arg-type]
        self._tw: Any = None  # the textworld environment, reused across resets
        self._loaded: Path | None = None
        self._game_index = -1
        self._actions: list[str] = []
        self._score = 0.0
        self._max_score = 0.0
        self._walkthrough: list[str] = []
        self._won = False
        self._lost = False
        self._done = False
        self.task_type = "textworld"

    # -- games -----------------------------------------------------------------------------------------
    def game_file(self, index: int) -> Path:
        """The compiled game file of game ``index`` (generated on first use)."""
        if self._files is not None:
            return self._files[index]
        spec, seed = self._games[index]
        assert spec is not None and seed is not None
        if index in self._paths:
            return self._paths[index]
        path = game_path(spec, seed, self.cache_dir)
        if not _is_complete(path) and self.prepare == "on_miss":
            ensure_games(self._games, self.cache_dir)  # type: ignore[arg-type]
        self._paths[index] = ensure_game(spec, seed, self.cache_dir)
        return self._paths[index]

    def game_info(self, index: int) -> dict[str, Any]:
        spec, seed = self._games[index]
        return {"game": index, "game_seed": seed, "spec": spec.canonical if spec else str(self._files[index])}

    def _load(self, path: Path) -> None:
        import textworld

        if self._tw is not None and self._loaded == path:
            return
        infos = textworld.EnvInfos(
            admissible_commands=True,
            won=True,
            lost=True,
            objective=True,
            score=True,
            max_score=True,
            extras=["walkthrough"],
        )
        with warnings.catch_warnings():
            # jericho cannot track score/moves in TextWorld's .z8 files; TextWorld tracks them itself.
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            if self._tw is None:
                self._tw = textworld.start(str(path), request_infos=infos)
            else:
                self._tw.load(str(path))
        self._loaded = path

    # -- the contract ------------------------------------------------------------------------------------
    def _pick_game(self, seed: int | None, options: dict[str, Any]) -> int:
        if options.get("game") is not None:
            return int(options["game"]) % self.num_games
        if seed is not None:
            return int(seed) % self.num_games
        return int(self.np_random.integers(self.num_games))

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = self._pick_game(seed, options)
        self._load(self.game_file(index))
        gs = self._tw.reset()
        spec = self._games[index][0]
        self._game_index = index
        self.task_type = spec.challenge if spec else "textworld"
        self._actions = []
        self._score = float(gs.get("score") or 0)
        self._max_score = float(gs.get("max_score") or 0)
        self._goal = (gs.get("objective") or "").strip()
        walkthrough = list(gs.get("extra.walkthrough") or [])
        self._walkthrough = [c for c in walkthrough if not (self.drop_meta and _is_meta(c))]
        self._won, self._lost, self._done = bool(gs.get("won")), bool(gs.get("lost")), False
        self._admissible = self._filter(gs.get("admissible_commands"))
        obs = clean_observation(gs.get("feedback") or "")
        if not self.goal_in_observation and self._goal and obs.startswith(self._goal):
            obs = obs[len(self._goal):].lstrip()
        return obs, {}

    def _filter(self, commands: Sequence[str] | None) -> list[str]:
        cmds = list(commands or [])
        if self.drop_meta:
            cmds = [c for c in cmds if not _is_meta(c)]
        return cmds

    def _step(self, action: str) -> StepResult:
        if self._game_index < 0:
            return self._reject("Call reset() before step().")
        if self._done:
            return self._reject("The episode is over; call reset().")
        cmd = normalize_command(action)
        if cmd not in (self._admissible or []):
            return self._reject("That is not a valid command here.")
        gs, score, _ = self._tw.step(cmd)
        self._actions.append(cmd)
        score = float(score or 0)
        delta = score - self._score
        self._score = score
        self._won, self._lost = bool(gs.get("won")), bool(gs.get("lost"))
        self._done = self._won or self._lost
        self._admissible = self._filter(gs.get("admissible_commands"))
        if self.reward_mode == "win":
            reward = 1.0 if self._won else 0.0
        else:
            reward = delta / self._max_score if self._max_score > 0 else 0.0
        obs = clean_observation(gs.get("feedback") or "")
        return obs, reward, self._done, False, {"invalid": False}

    def _info_defaults(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "won": self._won,
            "lost": self._lost,
            "walkthrough": list(self._walkthrough),
            "max_score": self._max_score,
            "score": self._score,
        }
        if self._game_index >= 0:
            info.update(self.game_info(self._game_index))
        return info

    # -- snapshots (replay from seed) ---------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """A snapshot: the game index and the commands executed since reset (replayed by :meth:`set_state`)."""
        if self._game_index < 0:
            raise RuntimeError("get_state() before reset()")
        return {**self.game_info(self._game_index), "actions": list(self._actions)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`get_state` snapshot by resetting its game and replaying its commands.

        Only ``game`` and ``actions`` are required; ``spec``/``game_seed``, when present, must match this
        env's game of that index (a snapshot taken with another task set is refused with ``ValueError``).
        """
        index = int(state["game"])
        if not 0 <= index < self.num_games:
            raise ValueError(f"snapshot game {index} outside this env's 0..{self.num_games - 1}")
        mine = self.game_info(index)
        for key in ("spec", "game_seed"):
            if key in state and state[key] != mine[key]:
                raise ValueError(
                    f"snapshot {key}={state[key]!r} does not match this env's game {index} ({mine})"
                )
        self.reset(options={"game": index})
        for cmd in state.get("actions", []):
            _obs, _, _, _, info = self.step(cmd)
            if info.get("invalid"):
                raise RuntimeError(f"replaying {cmd!r} failed: the snapshot does not match this game")

    def render(self) -> str:
        return self._last_obs

    def close(self) -> None:
        if self._tw is not None:
            with contextlib.suppress(Exception):
                self._tw.close()
            self._tw = None
            self._loaded = None
        super().close()


# ------------------------------------------------------------------------------------------------------
# Registration (cheap: nothing of textworld is imported here)
# ------------------------------------------------------------------------------------------------------
_ENTRY = "slea.envs.textworld:TextWorldEnv"
_COMMON = {"family": "textworld", "extra": "textworld", "requires": ("textworld",)}

register(
    "slea/TextWorld-v0",
    _ENTRY,
    description="TextWorld: coin collector 1-4 + treasure hunter 1-3 (default)",
    **_COMMON,
)
register(
    "slea/TextWorld-Coin-v0",
    _ENTRY,
    description="TextWorld coin collector, levels 1-4",
    tasks=("coin_collector:1", "coin_collector:2", "coin_collector:3", "coin_collector:4"),
    **_COMMON,
)
register(
    "slea/TextWorld-Treasure-v0",
    _ENTRY,
    description="TextWorld treasure hunter, levels 1-3",
    tasks=("treasure_hunter:1", "treasure_hunter:2", "treasure_hunter:3"),
    **_COMMON,
)
register(
    "slea/TextWorld-Simple-v0",
    _ENTRY,
    description="TextWorld 'simple' house game, dense rewards",
    tasks=("simple:dense",),
    **_COMMON,
)
register(
    "slea/TextWorld-Cooking-v0",
    _ENTRY,
    description="TextWorld cooking, 1-2 ingredients, 1 room",
    tasks=("cooking:1", "cooking:2:cut,open"),
    **_COMMON,
)
