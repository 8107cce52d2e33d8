"""``slea report RUN``: one self-contained HTML file about a run (or a ``slea compare`` folder).

:func:`gather` reads the folder into one JSON-able dict: the resolved config, the metrics rows (learning
curves), the evaluation tables (``eval/*.json``), the comparison (``compare.json``, ``table.json`` and each
sub-run's curve, for a compare folder), the experience library (``library.sqlite``: every entry with zone, level,
score, usage, clusters, and the recorded episodes it came from or was retrieved in) and the recorded episodes
(``episodes.jsonl``, slea/runs/episodes.py). :func:`render` puts that dict into the page template
(templates/report.html: inline CSS and JavaScript, no server, no network), whose script draws the curves as SVG
and the tables, the library browser and the episode viewer from the embedded JSON.
"""

from __future__ import annotations

import json
import logging
import math
from importlib import resources
from pathlib import Path
from typing import Any

from slea.evaluation import stats
from slea.runs.folder import SUMMARY, RunFolder
from slea.runs.jsonfile import CompareSpec, CompareTable, Evaluation, RunFileError, Summary, read_json

log = logging.getLogger(__name__)

MAX_ENTRIES = 5000  # library entries embedded (best score first)
PLACEHOLDER = "/*__SLEA_REPORT_DATA__*/null"
# the per-iteration keys drawn first; every other numeric metric can be picked in the page
# the charts shown first: learning, then the signs of a collapse (slea.evaluation.collapse)
MAIN_CURVES = ("train/success", "train/return", "train/invalid_rate", "rollout/entropy",
               "collapse/equal_return_frac", "collapse/distinct_first_actions")
# then the signals a verl or TRL user watches (docs/evaluation.md maps the names): (title, keys drawn together)
WATCH_CURVES = (
    ("response length (tokens)", ("response/length_mean", "response/length_max")),
    ("responses cut at max_new_tokens", ("response/clipped_frac",)),
    ("clip fraction", ("update/clip_frac", "update/clip_frac_lower")),
    ("approx. KL to π_old", ("update/approx_kl",)),
    ("KL to the reference", ("update/kl",)),
    ("token entropy (trained)", ("update/entropy",)),
    ("learning rate", ("update/lr",)),
    ("grad norm", ("update/grad_norm",)),
    ("seconds per phase", ("time/rollout_s", "time/generation_s", "time/env_s", "time/advantages_s",
                           "time/library_s", "time/train_s", "time/update_s")),
)


class ReportError(ValueError):
    """The folder is not something a report can be made of (the CLI prints it as one line, exit 2)."""


def kind_of(folder: Path) -> str:
    """``compare`` (a ``slea compare`` output), ``run`` (a run folder), else a :class:`ReportError`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReportError(f"{folder} is not a folder")
    if (folder / "compare.json").is_file() or ((folder / "table.json").is_file() and (folder / "runs").is_dir()):
        return "compare"
    if RunFolder(folder).is_run() or RunFolder(folder).metrics.is_file():
        return "run"
    raise ReportError(f"{folder} is neither a run folder (config.yaml, metrics.jsonl) nor a slea compare "
                      f"folder (compare.json, table.json)")


def clean(x: Any) -> Any:
    """``x`` with NaN/inf as None and tuples as lists: strict JSON, which the page's JSON.parse reads."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if x is None or isinstance(x, (str, int, bool)):
        return x
    try:
        return clean(float(x))  # numpy scalars
    except (TypeError, ValueError):
        return str(x)


def _read_json(path: Path, schema=None) -> Any:
    """A run-folder JSON file, capped and of ``schema``'s shape (slea/runs/jsonfile.py), or None after a warning."""
    try:
        return read_json(path, schema)
    except RunFileError as exc:
        log.warning("report: skipping %s (%s)", path, exc)
        return None


# -- a run folder --------------------------------------------------------------------------------------------
def run_overview(folder: Path) -> dict[str, Any]:
    import yaml

    run = RunFolder(folder)
    text = run.config.read_text() if run.is_run() else ""
    try:
        cfg = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        cfg = {}
    sec = lambda name: cfg.get(name) or {}
    summary = _read_json(run.summary, Summary) if run.summary.is_file() else None
    facts = {"algorithm": sec("algorithm").get("name"), "env": sec("env").get("id"),
             "model": sec("model").get("name_or_path"), "seed": sec("run").get("seed"),
             "experience": sec("experience").get("mode")}
    if isinstance(summary, dict):
        facts.update({k: summary.get(k) for k in ("iterations", "episodes", "wall_s", "checkpoint")})
    return {"name": folder.resolve().name, "config_text": text, "facts": facts}


def curves(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every numeric metric as a column over the logged iterations (``x``: iteration numbers counted from 1, as the
    log lines and checkpoint folders count them; ``metrics.jsonl`` keeps each step's index, from 0)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k, v in r.items() if k not in keys and k != "iteration" and isinstance(v, (int, float))
                 and not isinstance(v, bool)]
    series = {k: [r.get(k) if isinstance(r.get(k), (int, float)) else None for r in rows] for k in keys}
    main = [k for k in MAIN_CURVES if k in series]
    watch = [{"title": title, "keys": [k for k in keys if k in series]} for title, keys in WATCH_CURVES
             if any(k in series for k in keys)]
    return {"x": [r.get("iteration", i) + 1 for i, r in enumerate(rows)], "series": series, "main": main,
            "watch": watch}


def _fmt(v: Any, digits: int = 3) -> str:
    if isinstance(v, bool) or v is None:
        return "–" if v is None else str(v)
    if isinstance(v, (int, float)):
        return "–" if not math.isfinite(v) else f"{v:.{digits}f}" if isinstance(v, float) else str(v)
    return str(v)


def eval_tables(folder: Path) -> list[dict[str, Any]]:
    """One summary table over the evaluations (``eval/*.json`` but summary), then each one's paper table."""
    evals = RunFolder(folder).eval
    files = sorted(p for p in evals.glob("*.json") if p.stem != SUMMARY) if evals.is_dir() else []
    order = {"before": 0, "after": 1}
    files.sort(key=lambda p: (order.get(p.stem, 2), p.stem))
    results = [(p.stem, r) for p in files if isinstance(r := _read_json(p, Evaluation), dict)]
    if not results:
        return []
    cols = ["evaluation", "env", "sampled success", "return", "invalid rate", "episode length", "episodes",
            "greedy success", "per-game wins"]
    rows = []
    for name, r in results:
        s, g = r.get("sampled") or {}, r.get("greedy") or {}
        rows.append([name, r.get("env", ""), _fmt(s.get("success")), _fmt(s.get("return")),
                     _fmt(s.get("invalid_rate")), _fmt(s.get("episode_len"), 2), _fmt(s.get("episodes"), 0),
                     _fmt(g.get("success")), ", ".join(map(str, r.get("per_game_wins") or []))])
    out = [{"title": "Held-out evaluations", "columns": cols, "rows": rows,
            "note": "eval/*.json: sampled episodes at the evaluation temperature, greedy one per game"}]
    for name, r in results:
        t = r.get("table")
        if not isinstance(t, dict) or not t.get("rows"):
            continue
        tcols = list(t.get("columns") or [])
        trows = [[row.get("label", ""), *[_fmt((row.get("values") or {}).get(c), 1) for c in tcols],
                  str(row.get("episodes", ""))] for row in t["rows"]]
        out.append({"title": f"{name}: {t.get('title', '')}", "columns": ["", *tcols, "Episodes"],
                    "rows": trows, "note": t.get("note", "")})
    return out


def library(folder: Path, episodes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The library's entries, each with the recorded episodes it came from (``from``) and was retrieved in
    (``used``), as indices into ``episodes``; None when the run has no library."""
    path = RunFolder(folder).library
    if not path.is_file():
        return None
    from slea.experience.inspect import check_library, list_entries

    try:
        check_library(path)
        entries = list_entries(path, limit=MAX_ENTRIES)
    except Exception as exc:  # noqa: BLE001  (a damaged library must not cost the rest of the report)
        log.warning("report: cannot read %s (%s)", path, exc)
        return {"entries": [], "error": str(exc), "total": 0}
    came, used = {}, {}
    for i, ep in enumerate(episodes):
        for eid in ep.get("sourced") or []:
            came.setdefault(int(eid), []).append(i)
        for st in ep.get("steps") or []:
            for e in st.get("experiences") or []:
                lst = used.setdefault(int(e["id"]), [])
                if not lst or lst[-1] != i:
                    lst.append(i)
    keep = ("id", "zone", "level", "score", "usage", "success", "clusters", "task_type", "text", "context",
            "created_iter", "last_used_iter", "sources")
    rows = [{**{k: e.get(k) for k in keep}, "from": came.get(e["id"], []), "used": used.get(e["id"], [])[:50]}
            for e in entries]
    return {"entries": rows, "total": len(rows)}


def run_data(folder: Path) -> dict[str, Any]:
    from slea.runs.episodes import read_episodes
    from slea.runs.runlog import read_metrics

    episodes = read_episodes(RunFolder(folder).episodes)
    data = run_overview(folder)
    data.update({"kind": "run", "curves": curves(read_metrics(RunFolder(folder).metrics)),
                 "evals": eval_tables(folder), "library": library(folder, episodes), "episodes": episodes})
    return data


# -- a slea compare folder -------------------------------------------------------------------------------------
def _stat(s: dict[str, Any] | None) -> str:
    if not isinstance(s, dict) or s.get("mean") is None:
        return "–"
    return f"{s['mean']:.3f}" + (f" ± {s['std']:.3f}" if (s.get("n") or 0) > 1 else "")


def compare_data(folder: Path) -> dict[str, Any]:
    from slea.runs.runlog import env_step_curve, read_metrics

    spec = _read_json(folder / "compare.json", CompareSpec) if (folder / "compare.json").is_file() else None
    table = _read_json(folder / "table.json", CompareTable) if (folder / "table.json").is_file() else None
    spec = spec if isinstance(spec, dict) else (table or {}).get("spec") or {}
    table = table if isinstance(table, dict) else {}
    budgets = table.get("budgets") or []
    cols = ["algorithm", "seeds", "held-out success", "greedy", "untrained",
            *[f"train succ. @ {b} steps" for b in budgets], "env steps", "wall (min)"]
    rows = []
    for algo, a in (table.get("algorithms") or {}).items():
        at = a.get("train_success_at_env_steps") or {}
        wall = (a.get("wall_s") or {}).get("mean")
        rows.append([algo, ", ".join(map(str, a.get("seeds") or [])), _stat(a.get("heldout_success")),
                     _stat(a.get("heldout_greedy_success")), _stat(a.get("heldout_success_before")),
                     *[_stat(at.get(str(b))) for b in budgets], _fmt((a.get("env_steps") or {}).get("mean"), 0),
                     _fmt(wall / 60 if wall is not None else None, 1)])
    runs = []
    for sub in sorted(p for p in (folder / "runs").glob("*") if p.is_dir()) if (folder / "runs").is_dir() else []:
        algo, _, seed = sub.name.rpartition("-s")
        x, ys = env_step_curve(read_metrics(RunFolder(sub).metrics))
        runs.append({"name": sub.name, "algorithm": algo or sub.name, "seed": seed, "x": x.tolist(),
                     "series": {k: v.tolist() for k, v in ys.items()}})
    note = (f"config {spec.get('config')}, seeds {spec.get('seeds')}, overrides {spec.get('overrides')}"
            if spec else "")
    pairs = [c for c in table.get("pairs") or [] if isinstance(c, dict)]
    try:  # each arm against the baseline, paired by seed: table.md's table of p, CI and verdict
        against = {"title": f"Against {table.get('baseline')}, held-out success paired by seed",
                   "columns": [h.strip() for h in stats.TABLE_HEAD.strip("|").split("|")],
                   "rows": [stats.table_cells(c) for c in pairs], "note": stats.TABLE_NOTE} if pairs else None
    except (KeyError, TypeError, ValueError, IndexError) as exc:  # a table.json not of this shape: left out, said
        log.warning("report: leaving out the paired comparisons of %s (%s)", folder / "table.json", exc)
        against = None
    return {"kind": "compare", "name": folder.resolve().name, "facts": {
        "algorithms": ", ".join(spec.get("algorithms") or (table.get("algorithms") or {}).keys()),
        "seeds": ", ".join(map(str, spec.get("seeds") or []))},
        "config_text": json.dumps(spec, indent=2) if spec else "",
        "comparison": {"title": "Algorithms compared", "columns": cols, "rows": rows, "note": note},
        "pairs": against, "runs": runs}


# -- the page ------------------------------------------------------------------------------------------------
def gather(folder: str | Path) -> dict[str, Any]:
    """Everything the page shows, as strict JSON-able data."""
    folder = Path(folder)
    return clean(compare_data(folder) if kind_of(folder) == "compare" else run_data(folder))


def embed(data: dict[str, Any]) -> str:
    """``data`` as JSON that is safe inside a ``<script>`` element (no ``</script>`` can close it)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render(data: dict[str, Any]) -> str:
    template = resources.files("slea").joinpath("evaluation", "templates", "report.html").read_text("utf-8")
    title = f"slea report: {data.get('name', '')}".replace("&", "&amp;").replace("<", "&lt;")
    return template.replace("__SLEA_TITLE__", title).replace(PLACEHOLDER, embed(data))


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of ``folder`` (default ``<folder>/report.html``); returns its path."""
    from slea.atomic import atomic_write_text

    folder = Path(folder)
    out = Path(out) if out is not None else RunFolder(folder).report
    return atomic_write_text(out, render(gather(folder)))
