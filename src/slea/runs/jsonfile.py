"""Reading the JSON files of a run folder (a checkpoint's manifest, state and optimizer groups, the evaluations and
summary, a comparison's spec and table) as untrusted input: each read is capped in size and in nesting depth and
validated against a pydantic schema, and whatever is wrong with a file is one :class:`RunFileError` line naming it.

Why each cap: ``json.loads`` reads the whole file into memory and then builds objects several times its size (a
600 MB manifest took 1.5 GB and 18 s), and it recurses once per nesting level, so a file of 100 000 ``[`` ends in a
``RecursionError`` instead of an answer. A file larger than ``max_bytes`` is refused before it is read; the depth
is checked on the parsed value (:data:`MAX_DEPTH` levels; what slea writes nests less than 10 deep).

A schema describes the shape the readers rely on (objects where they call ``.get``, numbers where they compute);
it allows keys it does not name, so a newer slea's files still read. :func:`read_json` returns the value as parsed
(a dict stays a dict), after it passed the schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MIB = 2**20
MAX_BYTES = 16 * MIB  # the default cap of one run-folder JSON file
MAX_DEPTH = 64  # nesting levels (objects and lists) of one file at most


class RunFileError(ValueError):
    """A run-folder JSON file that is missing, too large, too deep, not JSON, or not of its schema's shape."""


class Loose(BaseModel):
    """A schema's base: keys it does not name are allowed (a newer slea may write more)."""

    model_config = ConfigDict(extra="allow")


def size_text(n: int) -> str:
    """A byte count as a person reads it: ``600 MiB``, ``1.5 MiB``, ``2048 bytes``."""
    return f"{n} bytes" if n < MIB else f"{n / MIB:g} MiB" if n % MIB == 0 else f"{n / MIB:.1f} MiB"


def depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value (a scalar 0, ``[]`` 1, ``[[1]]`` 2), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            d += 1
            deepest = max(deepest, d)
            if d > MAX_DEPTH:  # deep enough to refuse: the rest need not be walked
                return d
            stack.extend((x, d) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def schema_error(exc: ValidationError) -> str:
    """The first error of a pydantic validation as ``key.path: message`` (one line)."""
    e = exc.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")  # a validator's own message, as it wrote it
    return f"{loc}: {msg}" if loc else msg


def read_json(path: str | Path, schema: type[BaseModel] | None = None, *, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value in ``path``, checked: at most ``max_bytes`` bytes (refused before reading when larger), valid
    UTF-8 JSON, at most :data:`MAX_DEPTH` levels deep, and of ``schema``'s shape when given (the value is returned
    as parsed). Anything else is a :class:`RunFileError` naming the file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise RunFileError(f"{path.name} is {size_text(size)}, more than the {size_text(max_bytes)} such a file "
                               f"may be")
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)  # the file may have grown since its size was read
    except FileNotFoundError:
        raise RunFileError(f"{path.name} is missing") from None
    except OSError as exc:
        raise RunFileError(f"{path.name} cannot be read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise RunFileError(f"{path.name} is more than the {size_text(max_bytes)} such a file may be")
    try:
        value = json.loads(data)
    except RecursionError:
        raise RunFileError(f"{path.name} nests deeper than {MAX_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise RunFileError(f"{path.name} is not JSON ({str(exc)[:200]})") from None
    if depth(value) > MAX_DEPTH:
        raise RunFileError(f"{path.name} nests deeper than {MAX_DEPTH} levels")
    if schema is not None:
        try:
            schema.model_validate(value)
        except ValidationError as exc:
            raise RunFileError(f"{path.name}: {schema_error(exc)}") from None
    return value


def parse_line(line: str, schema: type[BaseModel] | None = None, max_chars: int = MIB) -> tuple[Any, str]:
    """One line of a JSON-lines file as ``(object, "")``, or ``(None, why)`` when it is not a JSON object within
    ``max_chars`` characters and :data:`MAX_DEPTH` levels of ``schema``'s shape (blank: ``(None, "")``)."""
    if not line.strip():
        return None, ""
    if len(line) > max_chars:
        return None, f"longer than {max_chars} characters"
    try:
        row = json.loads(line)
    except RecursionError:
        return None, f"nests deeper than {MAX_DEPTH} levels"
    except ValueError as exc:
        return None, f"not JSON ({str(exc)[:80]})"
    if not isinstance(row, dict):
        return None, "not a JSON object"
    if depth(row) > MAX_DEPTH:
        return None, f"nests deeper than {MAX_DEPTH} levels"
    if schema is not None:
        try:
            schema.model_validate(row)
        except ValidationError as exc:
            return None, schema_error(exc)
    return row, ""


def read_jsonl(path: str | Path, schema: type[BaseModel] | None = None,
               say: Callable[[int, str, str], object] | None = None) -> list[dict[str, Any]]:
    """Every good line of a JSON-lines file (:func:`parse_line`: a run's ``metrics.jsonl``, ``episodes.jsonl``);
    each other non-blank line is skipped, told to ``say(number, line, why)`` when given (a line torn by a kill
    loses that row only, never the file)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        row, why = parse_line(line, schema)
        if row is not None:
            rows.append(row)
        elif why and say is not None:
            say(number, line, why)
    return rows


# -- the evaluation and summary files every reader of a run reads -----------------------------------------------------
Num = Annotated[float, Field(strict=True)]  # a JSON number (an integer too), never a string or true/false
Int = Annotated[int, Field(strict=True)]


class Outcome(Loose):
    """One condition of an evaluation (``sampled``, ``greedy``): its rates are numbers or null."""

    success: Num | None = None
    invalid_rate: Num | None = None
    episodes: Num | None = None


class Evaluation(Loose):
    """``eval/<name>.json``: an evaluation of held-out games."""

    sampled: Outcome | None = None
    greedy: Outcome | None = None
    games: Int | None = None
    per_game_wins: list[Num] | None = None
    wall_s: Num | None = None


class Summary(Loose):
    """``eval/summary.json``, written last by a finished run."""

    before: Evaluation | None = None
    after: Evaluation | None = None
    wall_s: Num | None = None
    episodes: Num | None = None
    iterations: Int | None = None
    stages: Int | None = None


class MetricsRow(Loose):
    """A ``metrics.jsonl`` row: its step index, and the numbers the curves and tables compute with."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    iteration: Annotated[int, Field(strict=True, ge=0)]
    env_steps: Num | None = None
    episodes: Num | None = None
    rollouts: Num | None = None
    train_success: Num | None = Field(None, alias="train/success")
    train_return: Num | None = Field(None, alias="train/return")
    train_invalid_rate: Num | None = Field(None, alias="train/invalid_rate")
    train_episode_len: Num | None = Field(None, alias="train/episode_len")
    train_episodes: Num | None = Field(None, alias="train/episodes")


class EpisodeRow(Loose):
    """An ``episodes.jsonl`` row (slea/runs/episodes.py): the iteration it was played in and its steps."""

    iteration: Annotated[int, Field(strict=True, ge=0)]
    steps: list[dict[str, Any]] = Field(default_factory=list)


class CompareSpec(Loose):
    """``compare.json``: what a comparison was asked."""

    config: str | None = None
    algorithms: list[str] = Field(default_factory=list)
    seeds: list[Int] = Field(default_factory=list)
    overrides: list[str] = Field(default_factory=list)
    baseline: str | None = None
    variants: dict[str, list[str]] | None = None


class CompareTable(Loose):
    """``table.json`` of a comparison (only its spec is read back)."""

    spec: CompareSpec | None = None
