"""Paper-style evaluation tables, one layout per env family, from a list of trajectories.

Each family registers a *cell function* (``@family_table("alfworld", ...)``) that reads a list of
:class:`slea.types.Trajectory` and returns the table's cells for one row (a method, a decoding mode, a model);
:func:`build_table` lays several such rows out as a :class:`PaperTable`, which renders as a rich ``Table``, as
Markdown, or as a JSON-able dict (the ``table`` key of an evaluation result). Families without a layout get
the generic one (success %, mean return, invalid %, episode length).

The layouts follow the papers' result tables:

==============  ==============================================================================================
alfworld        success % per task type (Pick, Look, Clean, Heat, Cool, Pick2) and All (SLEA-RL Table 1, GiGPO)
webshop         Score (mean final score, 0-100) and Succ. % (score = 100) (SLEA-RL Table 1, GiGPO Table 1)
scienceworld    average final score (0-100) on Seen (dev variations) / Unseen (test) (tlm-DRE Table 1); the
                split is read from (task, variation), so a mixed episode list splits itself; per task columns
                when there are few tasks (``per_task``)
search_qa       EM and F1 % per dataset, and their averages over datasets (SLEA-RL Table 2, tlm-DRE HotpotQA)
sokoban,        success % per task type (when more than one) and All
textworld
==============  ==============================================================================================

Every row also counts its episodes: the small budgets of a CPU run make a 50 % cell out of two episodes, and
the table says so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slea.types import Trajectory

log = logging.getLogger(__name__)

GENERIC = "generic"


@dataclass
class Cell:
    """One number of a table (``None``: no episode for it) and the episodes it is taken over."""

    value: float | None
    n: int = 0


@dataclass
class Row:
    label: str
    cells: dict[str, Cell]
    episodes: int


CellFn = Callable[..., dict[str, Cell]]


@dataclass(frozen=True)
class FamilyLayout:
    family: str
    title: str
    cells: CellFn
    last: tuple[str, ...] = ()  # columns kept at the right end (All, Avg ...)
    note: str = ""


_LAYOUTS: dict[str, FamilyLayout] = {}


def family_table(family: str, *, title: str, last: Sequence[str] = (), note: str = "") -> Callable[[CellFn], CellFn]:
    """Register ``fn(trajectories, **options) -> {column: Cell}`` as the table layout of ``family``."""

    def deco(fn: CellFn) -> CellFn:
        _LAYOUTS[family] = FamilyLayout(family, title, fn, tuple(last), note)
        return fn

    return deco


def layouts() -> dict[str, FamilyLayout]:
    return dict(_LAYOUTS)


def family_of(env_id: str) -> str:
    """The family of a registered env id (its registry entry), else a guess from the id, else ``generic``."""
    import slea.envs as E  # registration only: no engine is imported

    spec = E.registered().get(env_id)
    if spec is not None and spec.family in _LAYOUTS:
        return spec.family
    low = env_id.lower().replace("-", "").replace("_", "")
    for fam in _LAYOUTS:
        if fam != GENERIC and fam.replace("_", "") in low:
            return fam
    return GENERIC


# ------------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------------
def _num(info: dict[str, Any], key: str) -> float | None:
    """``info[key]`` as a finite float; None when it is absent, not a number, or NaN / inf."""
    try:
        v = float(info[key])
    except (KeyError, TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _scores(trajs: Sequence[Trajectory], key: str, scale: float = 1.0) -> Cell:
    """Mean of ``scale * final_info[key]`` over the episodes that report it. Episodes without a finite value
    are left out (never counted as 0) and a warning says how many; none reporting it: a missing cell (–)."""
    vals = [v for v in (_num(t.final_info, key) for t in trajs) if v is not None]
    if len(vals) < len(trajs):
        log.warning("%d of %d episodes have no finite %r: left out of its mean", len(trajs) - len(vals),
                    len(trajs), key)
    return _mean(scale * v for v in vals)


def _mean(values: Iterable[float]) -> Cell:
    vals = list(values)
    return Cell(sum(vals) / len(vals), len(vals)) if vals else Cell(None, 0)


def _success(trajs: Sequence[Trajectory]) -> Cell:
    return _mean(100.0 * bool(t.won) for t in trajs)


def _by(trajs: Sequence[Trajectory], key: Callable[[Trajectory], str]) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = {}
    for t in trajs:
        out.setdefault(key(t), []).append(t)
    return out


def _task_type(t: Trajectory) -> str:
    return t.task_type or str(t.final_info.get("task_type", "")) or "?"


# ------------------------------------------------------------------------------------------------------------
# Layouts
# ------------------------------------------------------------------------------------------------------------
@family_table(GENERIC, title="success", last=("Success %", "Return", "Invalid %", "Len"))
def generic_cells(trajs: Sequence[Trajectory]) -> dict[str, Cell]:
    steps = sum(len(t.steps) for t in trajs)
    invalid = sum(t.invalid_count for t in trajs)
    return {
        "Success %": _success(trajs),
        "Return": _mean(t.episode_return for t in trajs),
        "Invalid %": Cell(100.0 * invalid / steps if steps else None, steps),
        "Len": _mean(float(len(t.steps)) for t in trajs),
    }


ALFWORLD_COLUMNS = {"pick": "Pick", "look": "Look", "clean": "Clean", "heat": "Heat", "cool": "Cool",
                    "pick_two": "Pick2"}


@family_table("alfworld", title="ALFWorld success %", last=("All",),
              note="success % per task type; All over every episode (SLEA-RL Table 1, GiGPO Table 1)")
def alfworld_cells(trajs: Sequence[Trajectory]) -> dict[str, Cell]:
    groups = _by(trajs, _task_type)
    cells = {col: _success(groups.get(tt, [])) for tt, col in ALFWORLD_COLUMNS.items()}
    for tt, members in groups.items():  # task types outside the six (custom game files)
        if tt not in ALFWORLD_COLUMNS:
            cells[tt] = _success(members)
    cells["All"] = _success(trajs)
    return cells


@family_table("webshop", title="WebShop", last=("Score", "Succ. %"),
              note="Score = mean final score (0-100), Succ. = score 100 (SLEA-RL Table 1, GiGPO Table 1)")
def webshop_cells(trajs: Sequence[Trajectory]) -> dict[str, Cell]:
    return {"Score": _scores(trajs, "score"), "Succ. %": _success(trajs)}


SCIENCEWORLD_SPLITS = {"dev": "Seen", "test": "Unseen", "train": "Train"}


def scienceworld_split(t: Trajectory) -> str:
    """``train`` / ``dev`` / ``test`` of an episode: from its (task, variation) and ScienceWorld's own split
    ranges when known (an explicit episode list can mix them), else the env's ``split``."""
    info = t.final_info
    task, var = info.get("task"), info.get("variation")
    if isinstance(task, str) and isinstance(var, int) and not isinstance(var, bool):
        from slea.envs.scienceworld import SPLIT_SIZES  # a table: nothing of the engine is imported

        sizes = SPLIT_SIZES.get(task)
        if sizes is not None:
            n_train, n_dev, _ = sizes
            return "train" if var < n_train else "dev" if var < n_train + n_dev else "test"
    split = str(info.get("split", "") or "")
    return {"seen": "dev", "heldout": "dev", "valid": "dev", "unseen": "test"}.get(split, split or "?")


@family_table("scienceworld", title="ScienceWorld average reward", last=("All",),
              note="average final score (0-100); Seen = dev variations, Unseen = test variations (tlm-DRE Table 1)")
def scienceworld_cells(trajs: Sequence[Trajectory], per_task: bool | None = None,
                       max_auto_tasks: int = 6) -> dict[str, Cell]:
    splits = _by(trajs, scienceworld_split)
    order = sorted(splits, key=lambda s: (list(SCIENCEWORLD_SPLITS).index(s) if s in SCIENCEWORLD_SPLITS else 9, s))
    cells = {SCIENCEWORLD_SPLITS.get(s, s): _scores(splits[s], "score") for s in order}
    tasks = _by(trajs, lambda t: str(t.final_info.get("task") or _task_type(t)))
    if per_task or (per_task is None and 1 < len(tasks) <= max_auto_tasks):
        for task in sorted(tasks):
            cells[task] = _scores(tasks[task], "score")
    if len(splits) > 1:
        cells["All"] = _scores(trajs, "score")
    return cells


@family_table("search_qa", title="Search-QA", last=("Avg EM", "Avg F1"),
              note="exact match and token F1, % per dataset; Avg = mean over datasets (SLEA-RL Table 2)")
def search_qa_cells(trajs: Sequence[Trajectory]) -> dict[str, Cell]:
    datasets = _by(trajs, _task_type)
    cells: dict[str, Cell] = {}
    ems, f1s = [], []
    for ds in sorted(datasets):
        em = _scores(datasets[ds], "em", 100.0)
        f1 = _scores(datasets[ds], "f1", 100.0)
        cells[f"{ds} EM"], cells[f"{ds} F1"] = em, f1
        ems.append(em.value)
        f1s.append(f1.value)
    if len(datasets) > 1:
        cells["Avg EM"] = _average(ems, len(trajs))
        cells["Avg F1"] = _average(f1s, len(trajs))
    return cells


def _average(values: Sequence[float | None], n: int) -> Cell:
    """Mean over datasets; missing (–) when any dataset has no value, rather than averaging the rest."""
    if not values or any(v is None for v in values):
        return Cell(None, n)
    return Cell(sum(values) / len(values), n)


def _success_per_type(trajs: Sequence[Trajectory]) -> dict[str, Cell]:
    groups = _by(trajs, _task_type)
    cells = {tt: _success(groups[tt]) for tt in sorted(groups)} if len(groups) > 1 else {}
    cells["All"] = _success(trajs)
    return cells


@family_table("sokoban", title="Sokoban success %", last=("All",), note="success % per task type and over all")
def sokoban_cells(trajs: Sequence[Trajectory]) -> dict[str, Cell]:
    return _success_per_type(trajs)


@family_table("textworld", title="TextWorld success %", last=("All",),
              note="success % per challenge and over all")
def textworld_cells(trajs: Sequence[Trajectory]) -> dict[str, Cell]:
    return _success_per_type(trajs)


# ------------------------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------------------------
@dataclass
class PaperTable:
    family: str
    title: str
    rows: list[Row] = field(default_factory=list)
    note: str = ""
    last: tuple[str, ...] = ()

    @property
    def columns(self) -> list[str]:
        cols: list[str] = []
        for row in self.rows:
            cols += [c for c in row.cells if c not in cols]
        tail = [c for c in self.last if c in cols]
        return [c for c in cols if c not in tail] + tail

    def add(self, label: str, trajs: Sequence[Trajectory], **options: Any) -> Row:
        layout = _LAYOUTS.get(self.family, _LAYOUTS[GENERIC])
        row = Row(label, layout.cells(list(trajs), **options), len(trajs))
        self.rows.append(row)
        return row

    def value(self, label: str, column: str) -> float | None:
        for row in self.rows:
            if row.label == label:
                cell = row.cells.get(column)
                return cell.value if cell else None
        raise KeyError(label)

    # -- renderings ------------------------------------------------------------------------------------------
    @staticmethod
    def fmt(cell: Cell | None) -> str:
        """``–`` for a missing cell: no value, or a NaN / inf one (e.g. read back from a JSON report)."""
        if cell is None or cell.value is None or not math.isfinite(cell.value):
            return "–"
        return f"{cell.value:.1f}"

    def to_markdown(self, *, first: str = "Model / method", title: bool = True) -> str:
        cols = self.columns
        lines = [f"**{self.title}**", ""] if title else []
        lines.append("| " + " | ".join([first, *cols, "Episodes"]) + " |")
        lines.append("|" + "---|" * (len(cols) + 2))
        for row in self.rows:
            vals = [self.fmt(row.cells.get(c)) for c in cols]
            lines.append("| " + " | ".join([row.label, *vals, str(row.episodes)]) + " |")
        if self.note:
            lines += ["", f"_{self.note}_"]
        return "\n".join(lines) + "\n"

    def to_rich(self, *, first: str = ""):
        from rich.table import Table

        t = Table(title=self.title, caption=self.note or None)
        t.add_column(first)
        for c in self.columns:
            t.add_column(c, justify="right")
        t.add_column("Episodes", justify="right")
        for row in self.rows:
            t.add_row(row.label, *[self.fmt(row.cells.get(c)) for c in self.columns], str(row.episodes))
        return t

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "title": self.title,
            "columns": self.columns,
            "rows": [{"label": r.label, "episodes": r.episodes,
                      "values": {c: cell.value for c, cell in r.cells.items()},
                      "n": {c: cell.n for c, cell in r.cells.items()}} for r in self.rows],
            "note": self.note,
            "last": list(self.last),
            "markdown": self.to_markdown(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PaperTable:
        rows = [Row(r["label"], {c: Cell(v, int(r.get("n", {}).get(c, 0))) for c, v in r["values"].items()},
                    int(r.get("episodes", 0))) for r in d.get("rows", [])]
        return cls(d["family"], d.get("title", d["family"]), rows, d.get("note", ""), tuple(d.get("last", ())))


def new_table(family_or_env: str, title: str | None = None) -> PaperTable:
    """An empty table with the layout of a family (``"alfworld"``) or of an env id's family."""
    family = family_or_env if family_or_env in _LAYOUTS else family_of(family_or_env)
    layout = _LAYOUTS[family]
    return PaperTable(family, title or layout.title, note=layout.note, last=layout.last)


def build_table(family_or_env: str, rows: dict[str, Sequence[Trajectory]] | Sequence[tuple[str, Sequence[Trajectory]]],
                *, title: str | None = None, **options: Any) -> PaperTable:
    """A table of ``family_or_env``'s layout with one row per (label, trajectories)."""
    table = new_table(family_or_env, title)
    for label, trajs in (rows.items() if isinstance(rows, dict) else rows):
        table.add(label, trajs, **options)
    return table


def merge(tables: Sequence[PaperTable | dict[str, Any]], *, prefix: Sequence[str] | None = None) -> PaperTable:
    """One table from several of the same family (rows appended; ``prefix[i]`` is put before table i's row
    labels), e.g. the tables of several evaluation results."""
    tabs = [t if isinstance(t, PaperTable) else PaperTable.from_dict(t) for t in tables]
    if not tabs:
        raise ValueError("no tables to merge")
    out = PaperTable(tabs[0].family, tabs[0].title, [], tabs[0].note, tabs[0].last)
    for i, t in enumerate(tabs):
        if t.family != out.family:
            raise ValueError(f"cannot merge a {t.family} table into a {out.family} table")
        pre = f"{prefix[i]} " if prefix and prefix[i] else ""
        out.rows += [Row(pre + r.label, dict(r.cells), r.episodes) for r in t.rows]
    return out
