"""Does a refactor of the run lifecycle change any number? Two source trees, the same runs, compared file by file.

``--before DIR`` and ``--after DIR`` are two checkouts' roots. Each tree runs three cases as ``slea train``
processes with ``PYTHONPATH=<tree>/src`` (this interpreter, so the same torch and packages), each into its own run
folder, with the tree's own config files and the same seeds and overrides, single-threaded (``run.threads=1``):

* ``smoke``: configs/smoke.yaml (the tiny random model, GRPO, 2 iterations, held-out evaluation after);
* ``team_smoke``: configs/teamtr_smoke.yaml (a TeamTR planner + actor team, 2 stages);
* ``resume``: configs/smoke.yaml with the experience library on, SIGKILLed inside iteration 1's checkpoint
  (``slea.testing.kill_checkpoint``), then ``slea train --resume`` (re-runs iteration 1 from iteration 0's
  checkpoint), then ``--resume --set train.iterations=3`` (extends the finished run by one iteration).

Then every file of the before run folder is compared with its namesake in the after one (:func:`compare_runs`):
metrics and episode rows key by key, checkpoint and adapter tensors with ``torch.equal``, JSON files value by
value, ``library.sqlite`` table by table, row by row. Left out of the comparison (:data:`EXCLUDED`): what measures
this run's own clock (wall times and the rates derived from them), the run's own path, and files that only
render, log or point elsewhere. Everything else must be equal bit for bit: both trees run on this machine, on the
same CPU kind, with the same thread count (case 1 of slea.testing.numerics).

Writes ``bench/results/redesign_equivalence.json`` (``--out``): per case, per file, ``equal`` or ``differs: <the
first difference>``. Run it alone, as every training command (``heavy``)::

    .venv/bin/python bench/redesign_equivalence.py --before ../before --after .
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "redesign_equivalence.json"

# metrics keys that measure this process's clock: wall times and the rates derived from them
VOLATILE_PREFIXES = ("time/", "throughput/")
VOLATILE_METRICS = frozenset({"library/evolve_s", "update/old_logprobs_s"})
# JSON keys (at any depth) that hold a wall time or the run folder's own path: an evaluation's and a run's wall_s,
# a team checkpoint's state.json train_s (training seconds so far, for train.time_budget_s), summary.json's run_dir
VOLATILE_JSON = frozenset({"wall_s", "train_s", "run_dir"})
# config.yaml: the run folder is each run's own
VOLATILE_CONFIG = (("run", "dir"),)
# files and folders not compared, and why
EXCLUDED = {
    "events/": "TensorBoard event files: wall-clock timestamps in every record and in the file name; their scalars "
               "are the metrics rows, compared in metrics.jsonl",
    "curves.png": "a rendering of metrics.jsonl (its time curves included), compared there",
    "loggers.json": "external loggers' run ids (none configured here)",
}
# compared in part: a checkpoint's manifest.json by its iteration and the names it lists, not its sha256 and sizes
# (state.json's change with its wall_s; every file it lists is compared itself)
PARTIAL = {"checkpoints/*/manifest.json": "iteration and file names only"}
THREADS = ["run.threads=1"]
SMOKE = ("configs/smoke.yaml", THREADS)
TEAM = ("configs/teamtr_smoke.yaml", THREADS)
KILL_PLUGIN = "plugins=[slea.testing.kill_checkpoint]"
# the experience library on from iteration 1, so library.sqlite and its checkpoint snapshots are compared too (a
# resume restores the library from the checkpoint's snapshot)
LIBRARY = ["experience.mode=step", "experience.warmup_iters=1", "experience.min_entries=1"]
RESUME = ("configs/smoke.yaml", [*THREADS, "train.iterations=2", *LIBRARY, KILL_PLUGIN])
EXTEND = ["train.iterations=3"]


# -- what counts as the same ----------------------------------------------------------------------------------
def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same type (an int turned float is a change, though ``1 == 1.0``); NaN equals NaN (a metric
    may be NaN in both runs)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two JSON values first differ (``key.sub[3]: before != after``), or None when they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path or '.'}: keys only in before {sorted(a.keys() - b.keys())}, " \
                   f"only in after {sorted(b.keys() - a.keys())}"
        return next((d for k in a if (d := first_difference(a[k], b[k], f"{path}.{k}" if path else k))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path or '.'}: {len(a)} items before, {len(b)} after"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{path}[{i}]"))),
                    None)
    return None if same_value(a, b) else f"{path or '.'}: {_short(a)} != {_short(b)}"


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 120 else s[:117] + "..."


def drop_keys(value: Any, keys: frozenset[str]) -> Any:
    """``value`` with every dict key in ``keys`` removed, at any depth."""
    if isinstance(value, dict):
        return {k: drop_keys(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [drop_keys(v, keys) for v in value]
    return value


def comparable_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row without the keys that time this process (:data:`VOLATILE_PREFIXES`, :data:`VOLATILE_METRICS`)."""
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE_PREFIXES) and k not in VOLATILE_METRICS}


# -- one file each way ----------------------------------------------------------------------------------------
def read_jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_jsonl(a: Path, b: Path, clean: Callable[[Any], Any] = lambda r: r) -> str | None:
    """Row by row, after ``clean``; the first difference names its row (and its iteration when it has one)."""
    ra, rb = [clean(r) for r in read_jsonl(a)], [clean(r) for r in read_jsonl(b)]
    if len(ra) != len(rb):
        return f"{len(ra)} rows before, {len(rb)} after"
    for i, (x, y) in enumerate(zip(ra, rb)):
        if d := first_difference(x, y):
            where = f"row {i}" + (f" (iteration {x['iteration']})" if isinstance(x, dict) and "iteration" in x else "")
            return f"{where}: {d}"
    return None


def compare_json(a: Path, b: Path) -> str | None:
    """JSON values without :data:`VOLATILE_JSON` keys."""
    return first_difference(*(drop_keys(json.loads(p.read_text()), VOLATILE_JSON) for p in (a, b)))


def compare_manifest(a: Path, b: Path) -> str | None:
    """A checkpoint manifest: its iteration and the names of the files it lists (their contents are compared
    file by file; the hashes change with state.json's wall time)."""
    def names(p: Path) -> dict[str, Any]:
        m = json.loads(p.read_text())
        return {"iteration": m.get("iteration"), "files": sorted(m.get("files", {}))}
    return first_difference(names(a), names(b))


def compare_config(a: Path, b: Path) -> str | None:
    """The resolved config.yaml, less each run's own folder (:data:`VOLATILE_CONFIG`)."""
    def load(p: Path) -> Any:
        cfg = yaml.safe_load(p.read_text())
        for section, key in VOLATILE_CONFIG:
            cfg.get(section, {}).pop(key, None)
        return cfg
    return first_difference(load(a), load(b))


def compare_tensors(a: Path, b: Path) -> str | None:
    """A safetensors file: the same tensor names, and each pair ``torch.equal`` (dtype and shape included)."""
    ta, tb = load_file(str(a)), load_file(str(b))
    if ta.keys() != tb.keys():
        return f"tensors only in before {sorted(ta.keys() - tb.keys())}, only in after {sorted(tb.keys() - ta.keys())}"
    for name in sorted(ta):
        x, y = ta[name], tb[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"{name}: {x.dtype} {tuple(x.shape)} != {y.dtype} {tuple(y.shape)}"
        if not torch.equal(x, y):
            diff = (x.double() - y.double()).abs()
            return f"{name}: {int((diff > 0).sum())} of {x.numel()} elements differ, max |diff| {diff.max().item():.3g}"
    return None


def sqlite_rows(path: Path) -> dict[str, list[list[Any]]]:
    """Every table's rows, in a fixed order (sorted), read-only."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {t: sorted(([*r] for r in con.execute(f'SELECT * FROM "{t}"')), key=repr) for t in tables}
    finally:
        con.close()


def compare_sqlite(a: Path, b: Path) -> str | None:
    return first_difference(sqlite_rows(a), sqlite_rows(b))


def compare_bytes(a: Path, b: Path) -> str | None:
    da, db = a.read_bytes(), b.read_bytes()
    if da == db:
        return None
    at = next((i for i, (x, y) in enumerate(zip(da, db)) if x != y), min(len(da), len(db)))
    return f"bytes differ from offset {at} ({len(da)} bytes before, {len(db)} after)"


def comparator(rel: str) -> Callable[[Path, Path], str | None]:
    """How the run-folder file ``rel`` (a posix path inside the folder) is compared."""
    name = rel.rsplit("/", 1)[-1]
    if rel == "metrics.jsonl":
        return lambda a, b: compare_jsonl(a, b, comparable_metrics)
    if name.endswith(".jsonl"):
        return compare_jsonl
    if name == "manifest.json" and rel.startswith("checkpoints/"):
        return compare_manifest
    if name.endswith((".json", ".json.previous")):
        return compare_json
    if name.endswith(".safetensors"):
        return compare_tensors
    if name.endswith(".sqlite"):
        return compare_sqlite
    if rel == "config.yaml":
        return compare_config
    return compare_bytes


def excluded(rel: str) -> bool:
    """Whether ``rel`` is one of :data:`EXCLUDED` (a folder given with its ``/``, or a file's name)."""
    return any(rel.startswith(e) if e.endswith("/") else rel == e for e in EXCLUDED)


def run_files(run: Path) -> set[str]:
    """The run folder's files as posix paths inside it, the excluded ones left out."""
    rels = (p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())
    return {r for r in rels if not excluded(r)}


def compare_runs(before: Path, after: Path) -> dict[str, str]:
    """Each file of two run folders: ``equal``, ``differs: <first difference>``, or ``only in before/after``."""
    fa, fb = run_files(before), run_files(after)
    out = {}
    for rel in sorted(fa | fb):
        if rel not in fb:
            out[rel] = "only in before"
        elif rel not in fa:
            out[rel] = "only in after"
        else:
            d = comparator(rel)(before / rel, after / rel)
            out[rel] = "equal" if d is None else f"differs: {d}"
    return out


def trained(run: Path) -> bool:
    """Whether training moved the weights: a LoRA B matrix (zero at init) of any saved weights file is nonzero, so
    equal weights are not equal merely because nothing trained."""
    for p in run.rglob("*.safetensors"):
        if p.name.startswith(("optimizer", "rng")):
            continue
        if any(("lora_B" in k) and bool(t.any()) for k, t in load_file(str(p)).items()):
            return True
    return False


# -- running the cases in one tree ---------------------------------------------------------------------------
def slea_train(tree: Path, run: Path, config: str | None, overrides: list[str],
               kill_at: int | None = None) -> dict[str, Any]:
    """``slea train CONFIG --set run.dir=RUN --set ...`` (``config`` None: ``slea train --resume RUN --set ...``) as
    ``python -m slea.cli`` on ``tree``'s source (PYTHONPATH), offline; with ``kill_at``, armed to SIGKILL itself
    inside that step's checkpoint. Returns the command as written with RUN for the run folder, whether it ended
    as wanted (exit 0, or killed), its wall time and, when it did not, its last lines of stderr."""
    env = {k: v for k, v in os.environ.items() if k != "SLEA_TEST_KILL_AT"}
    env.update(PYTHONPATH=str(tree / "src"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    if kill_at is not None:
        env["SLEA_TEST_KILL_AT"] = str(kill_at)
    head = ["--resume", "RUN"] if config is None else [config, "--set", "run.dir=RUN"]
    args = [*head, *(x for o in overrides for x in ("--set", o))]
    t0 = time.perf_counter()
    real = [str(run) if a == "RUN" else f"run.dir={run}" if a == "run.dir=RUN" else a for a in args]
    r = subprocess.run([sys.executable, "-m", "slea.cli", "train", *real], cwd=tree, env=env, capture_output=True,
                       text=True, check=False)
    want = -signal.SIGKILL if kill_at is not None else 0
    rec = {"command": " ".join(["slea train", *args]) + (f" (SLEA_TEST_KILL_AT={kill_at})" if kill_at is not None
                                                         else ""),
           "ok": r.returncode == want, "exit": r.returncode, "wall_s": round(time.perf_counter() - t0, 2)}
    if not rec["ok"]:
        rec["stderr_tail"] = r.stderr[-2000:].replace(str(run), "RUN")
    return rec


def run_case(case: str, tree: Path, run: Path) -> list[dict[str, Any]]:
    """The ``case`` (smoke, team_smoke, resume) in ``tree`` into the run folder ``run``: its commands' records, up
    to the first that did not end as wanted."""
    if case in ("smoke", "team_smoke"):
        config, over = SMOKE if case == "smoke" else TEAM
        return [slea_train(tree, run, config, over)]
    config, over = RESUME
    steps = [(config, over, 1), (None, [], None), (None, EXTEND, None)]
    done: list[dict[str, Any]] = []
    for cfg, o, kill in steps:
        done.append(slea_train(tree, run, cfg, o, kill_at=kill))
        if not done[-1]["ok"]:
            break
    return done


def describe(tree: Path) -> dict[str, Any]:
    """The tree's commit, how many of its src/ files differ from it, and whether its PYTHONPATH imports its own
    ``slea``."""
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *a], check=True, capture_output=True,
                              text=True).stdout.strip()
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    mod = subprocess.run([sys.executable, "-c", "import slea; print(slea.__file__)"], env=env,
                         check=True, capture_output=True, text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--", "src").splitlines()
    return {"commit": git("rev-parse", "HEAD"), "subject": git("log", "-1", "--format=%s")[:100],
            "src_changes_uncommitted": len(dirty), "slea_imported_from_tree": mod.startswith(str(tree / "src"))}


CASES = ("smoke", "team_smoke", "resume")


def equivalence(case: str, trees: dict[str, Path], work: Path) -> dict[str, Any]:
    """One case run in both trees (``work/<side>/<case>``) and its run folders compared; printed as it ends."""
    runs = {side: work / side / case for side in trees}
    commands = {side: run_case(case, tree, runs[side]) for side, tree in trees.items()}
    files = compare_runs(runs["before"], runs["after"])
    ran = all(c["ok"] for cs in commands.values() for c in cs)
    equal = ran and all(v == "equal" for v in files.values())
    print(f"{case}: " + ("all equal" if equal else "DIFFERS" if ran else "A RUN FAILED")
          + f" ({sum(v == 'equal' for v in files.values())}/{len(files)} files equal)", flush=True)
    for rel, verdict in files.items():
        if verdict != "equal":
            print(f"  {rel}: {verdict}")
    return {"commands": commands, "ran": ran, "trained": {s: trained(r) for s, r in runs.items()},
            "all_equal": equal, "files": files}


def left_out() -> dict[str, Any]:
    """What the comparison leaves out, and why (recorded with every result)."""
    return {"metrics keys": {"prefixes": list(VOLATILE_PREFIXES), "keys": sorted(VOLATILE_METRICS),
                             "why": "seconds and rates of this process's own clock"},
            "json keys (any depth)": {"keys": sorted(VOLATILE_JSON),
                                      "why": "wall_s, train_s: wall times (train_s: a team checkpoint's training "
                                             "seconds so far); run_dir: the run's own path"},
            "config.yaml": {"keys": [".".join(k) for k in VOLATILE_CONFIG], "why": "each run's own folder"},
            "files": EXCLUDED, "compared in part": PARTIAL}


def _fail(msg: str) -> None:
    print(msg, file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="a checkout's root: the tree before the change")
    ap.add_argument("--after", type=Path, required=True, help="a checkout's root: the tree after it")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--work", type=Path, default=None, help="where the run folders go (kept; default: a new temp dir)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for side, tree in trees.items():
        if not (tree / "src" / "slea").is_dir():
            _fail(f"--{side}: {tree} has no src/slea (not a checkout's root)")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if bad := [c for c in cases if c not in CASES]:
        _fail(f"--cases: unknown {bad}; known: {', '.join(CASES)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="redesign_eq_"))
    t0 = time.perf_counter()
    res: dict[str, Any] = {"trees": {s: describe(p) for s, p in trees.items()},
                           "cpu": _cpu_kind(), "torch": torch.__version__, "threads": 1,
                           "cases": {case: equivalence(case, trees, work) for case in cases}}
    res["all_equal"] = all(c["all_equal"] for c in res["cases"].values())
    res["excluded"] = left_out()
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["run_folders"] = "kept under a temporary folder (not recorded: a machine path)"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"all equal: {res['all_equal']}; {res['wall_s']} s; run folders in {work}; wrote {args.out}")


def _cpu_kind() -> str:
    """bench/mfu.py's CPU description, imported only here (the comparison functions need nothing of slea)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from mfu import cpu_kind

    return cpu_kind()


if __name__ == "__main__":
    main()
