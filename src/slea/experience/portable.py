"""Portable experience libraries: JSONL export/import with provenance, merge, and diff.

A library learned in one run is a file another run, another model or another user can load. The JSONL file is
one record per line, each with a ``kind``:

* ``header`` (first line): ``format`` (``slea-library``), ``version``, ``provenance`` (where the library was
  learned: ``run``, ``model``, ``env``, ``algorithm``, ``iteration`` — the run's last logged iteration) and
  ``settings`` (``capacity_pos``, ``capacity_neg``, ``novelty_threshold``, ``cluster_threshold``);
* ``cluster``: an observation cluster some entry links to (``id``, ``task_type``, ``prototype``, ``size``);
* ``entry``: an :class:`slea.experience.library.Entry` as a dict (``clusters`` are ids of the ``cluster``
  records) plus ``provenance``: the run, model, env and algorithm it was learned in and ``iteration`` = its
  ``created_iter``; ``merged`` lists the provenance of duplicates merged into it on import.

Import goes through the library's own admission path (``ExperienceLibrary.add``: novelty test, capacity per
zone and level), so a merge de-duplicates with exactly the rule training uses. Cluster ids are only meaningful
with their index: each ``cluster`` record's prototype is assigned in the destination's
:class:`ObservationIndex` (joining a similar cluster there, or opening one), and entry links are remapped to
those ids; links to clusters the file does not describe are dropped (retrieval's Eq.2 fallback re-links an entry
when an observation matches it). A library's per-entry provenance lives in its ``entry_origin`` table (written
by import; an entry without a row has the provenance of the run folder the file sits in).

``diff`` pairs the entries of two libraries with the same novelty rule (an entry of B that duplicates one of A
is "the same entry") and reports what was added, removed or changed, by zone and level.

A library file is data from elsewhere, so it is checked before anything is written (docs/reliability.md): every
field of a JSONL line or an SQLite row is validated (:class:`PortableError` naming the line or row and the field;
JSONL lines may instead be counted and skipped, ``strict=False``), every text capped (entry text and context as
the library stores them, task types, provenance, cluster prototypes, ``merged``), the file's size capped. An
import never destroys: the destination's settings (capacities, thresholds) win over the file's, and an import
that would evict entries the destination already holds is refused, saying how many, unless ``allow_evict``.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from slea.experience.clustering import ObservationIndex
from slea.experience.library import _COLS, LEVELS, ZONES, Entry, ExperienceLibrary
from slea.runs.folder import CHECKPOINTS, RunFolder
from slea.runs.sqlite import snapshot_sqlite

FORMAT = "slea-library"
VERSION = 1
PROVENANCE_KEYS = ("run", "model", "env", "algorithm", "iteration")
SETTING_KEYS = ("capacity_pos", "capacity_neg", "novelty_threshold", "cluster_threshold")
_ORIGIN_SCHEMA = "CREATE TABLE IF NOT EXISTS entry_origin (entry_id INTEGER PRIMARY KEY, origin TEXT NOT NULL)"
_DEFAULTS = {"capacity_pos": 100, "capacity_neg": 50, "novelty_threshold": 0.85, "cluster_threshold": 0.85}
_SETTINGS_KEY = "portable_settings"  # library_meta: the settings a library file was made with by an import

# caps on what a file may bring (longer texts are cut, larger files refused)
MAX_FILE_BYTES = 256 << 20
MAX_TEXT = 600  # as ExperienceLibrary stores an entry's text (sanitize)
MAX_CONTEXT = 300  # and its context
MAX_TASK_TYPE = 100
MAX_PROTOTYPE = 8000  # an observation cluster's prototype (an observation)
MAX_NAME = 200  # a provenance value (run, model, env, algorithm)
MAX_LINKS = 256  # cluster links per entry
MAX_SOURCES = 32  # source trajectory ids per entry (the library keeps the last 32)
MAX_MERGED = 8  # provenances of merged duplicates (the library keeps the last 8)
MAX_SCORE = 1e6  # |score|
MAX_CAPACITY = 1_000_000


@dataclass
class Portable:
    """A library as plain records: what a JSONL export holds, read from any source."""

    provenance: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    clusters: list[dict[str, Any]] = field(default_factory=list)  # id, task_type, prototype, size
    entries: list[dict[str, Any]] = field(default_factory=list)  # Entry.to_dict() + provenance (+ merged)
    malformed: int = 0  # JSONL lines skipped

    @cached_property
    def _prototype_of(self) -> dict[int, str]:
        return {c["id"]: c["prototype"] for c in self.clusters}

    def prototypes(self, entry: dict[str, Any]) -> list[str]:
        """The prototypes of the clusters an entry links to (what a link means across indexes)."""
        return sorted(self._prototype_of[c] for c in entry.get("clusters", []) if c in self._prototype_of)


class PortableError(ValueError):
    """A file that is not a library or a library export (the CLI prints it as one line, exit code 2)."""


# -- validation ---------------------------------------------------------------------------------------------------
class _Bad(ValueError):
    """One field of one record that does not fit: ``field`` and why."""

    def __init__(self, field_: str, why: str):
        super().__init__(f"{field_}: {why}")


def _cut(value: Any, limit: int, name: str, *, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise _Bad(name, f"expected text, got {type(value).__name__}")
    return value if len(value) <= limit else value[:limit]


def _int(value: Any, name: str, lo: int | None = None, hi: int = 2**62) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not (lo is None or value >= lo) or abs(value) > hi:
        bounds = f" >= {lo}" if lo is not None else ""
        raise _Bad(name, f"expected an integer{bounds}, got {value!r:.40}")
    return value


def _ints(value: Any, name: str, limit: int, lo: int | None = None) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Bad(name, f"expected a list of integers, got {type(value).__name__}")
    return [_int(v, name, lo) for v in value[-limit:]]


def _score(value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(float(value)) \
            or abs(float(value)) > MAX_SCORE:
        raise _Bad("score", f"expected a finite number within ±{MAX_SCORE:g}, got {value!r:.40}")
    return float(value)


def _provenance(value: Any, name: str = "provenance") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(name, f"expected an object, got {type(value).__name__}")
    out: dict[str, Any] = {}
    for k in PROVENANCE_KEYS:
        v = value.get(k)
        if k == "iteration":
            out[k] = None if v is None else _int(v, f"{name}.iteration")
        else:
            out[k] = None if v is None else _cut(v if isinstance(v, str) else str(v), MAX_NAME, f"{name}.{k}")
    return out


def check_settings(settings: Any, where: str = "settings") -> dict[str, Any]:
    """Library settings checked: capacities integers in 1..1,000,000, thresholds numbers in (0, 1]; unknown keys
    dropped. A :class:`PortableError` naming the field."""
    if not isinstance(settings, dict):
        raise PortableError(f"{where}: expected an object, got {type(settings).__name__}")
    out: dict[str, Any] = {}
    for k in SETTING_KEYS:
        if k not in settings:
            continue
        v = settings[k]
        if k.startswith("capacity"):
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_CAPACITY:
                raise PortableError(f"{where}.{k}: expected an integer in 1..{MAX_CAPACITY}, got {v!r:.40}")
        elif not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1:
            raise PortableError(f"{where}.{k}: expected a number in (0, 1], got {v!r:.40}")
        out[k] = v
    return out


def _checked_entry(d: Any, prov: dict[str, Any]) -> dict[str, Any]:
    """An entry record (a JSONL line or an SQLite row as a dict) checked field by field and capped; ``_Bad``
    names the first field that does not fit."""
    if not isinstance(d, dict):
        raise _Bad("entry", f"expected an object, got {type(d).__name__}")
    if d.get("zone") not in ZONES:
        raise _Bad("zone", f"expected one of {', '.join(ZONES)}, got {d.get('zone')!r:.40}")
    if d.get("level") not in LEVELS:
        raise _Bad("level", f"expected one of {', '.join(LEVELS)}, got {d.get('level')!r:.40}")
    text = _cut(d.get("text"), 4 * MAX_TEXT, "text", required=True)  # sanitize() cuts it to MAX_TEXT on adding
    e = Entry(_int(d.get("id", 0), "id", 0), text, d["zone"], d["level"], _score(d.get("score")),
              _cut(d.get("task_type"), MAX_TASK_TYPE, "task_type"), _cut(d.get("context"), 4 * MAX_CONTEXT, "context"),
              _ints(d.get("sources"), "sources", MAX_SOURCES), _ints(d.get("clusters"), "clusters", MAX_LINKS, 0),
              _int(d.get("usage", 0), "usage", 0), _int(d.get("success", 0), "success", 0),
              _int(d.get("created_iter", 0), "created_iter"), _int(d.get("last_used_iter", -1), "last_used_iter", -1)
              ).to_dict()
    p = d.get("provenance")
    e["provenance"] = _provenance(p) if p is not None else {**prov, "iteration": e["created_iter"]}
    merged = d.get("merged")
    if merged is not None:
        if not isinstance(merged, list):
            raise _Bad("merged", f"expected a list of provenances, got {type(merged).__name__}")
        if merged:
            e["merged"] = [_provenance(m, "merged[]") for m in merged[-MAX_MERGED:]]
    return e


def _checked_cluster(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise _Bad("cluster", f"expected an object, got {type(d).__name__}")
    return {"id": _int(d.get("id"), "id", 0), "task_type": _cut(d.get("task_type"), MAX_TASK_TYPE, "task_type"),
            "prototype": _cut(d.get("prototype"), MAX_PROTOTYPE, "prototype", required=True),
            "size": _int(d.get("size", 1), "size", 1)}


# -- provenance of a library file --------------------------------------------------------------------------------
def _run_of(path: Path) -> tuple[Path | None, int | None]:
    """The run folder a library file belongs to (``run/library.sqlite`` or a checkpoint's snapshot
    ``run/checkpoints/iter_N/library.sqlite``) and, for a snapshot, its iteration."""
    if RunFolder(path.parent).is_run():
        return path.parent, None
    ck = path.parent
    if ck.parent.name == CHECKPOINTS and RunFolder(ck.parent.parent).is_run():
        digits = ck.name.rsplit("_", 1)[-1]
        return ck.parent.parent, int(digits) if digits.isdigit() else None
    return None, None


def _last_iteration(run: Path) -> int | None:
    last = None
    try:
        lines = RunFolder(run).metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            last = int(json.loads(line)["iteration"])
        except (ValueError, KeyError, TypeError):
            continue  # a malformed line (a killed writer) says nothing about the iteration
    return last


def run_provenance(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(provenance, settings) of a library file from the run folder it sits in; empty when it is in none."""
    run, iteration = _run_of(Path(path))
    if run is None:
        return {}, {}
    try:
        cfg = yaml.safe_load(RunFolder(run).config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        cfg = {}
    def sec(name: str) -> dict[str, Any]:
        return cfg.get(name) if isinstance(cfg, dict) and isinstance(cfg.get(name), dict) else {}

    x = sec("experience")
    prov = {"run": sec("run").get("name") or run.name, "model": sec("model").get("name_or_path"),
            "env": sec("env").get("id"), "algorithm": sec("algorithm").get("name"),
            "iteration": iteration if iteration is not None else _last_iteration(run)}
    settings = {k: x[k] for k in ("capacity_pos", "capacity_neg", "novelty_threshold") if k in x}
    if "cluster_threshold" in x:
        settings["cluster_threshold"] = x["cluster_threshold"]
    return prov, settings


# -- reading -------------------------------------------------------------------------------------------------------
def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def read_library(path: str | Path) -> Portable:
    """A library file (SQLite) as records, read-only, every row checked (:func:`_checked_entry`); a
    ``PortableError`` naming the table, row and field if it is not a library or a row does not fit."""
    path = Path(path)
    if not path.is_file():
        raise PortableError(f"no experience library at {path}")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise PortableError(f"{path} has {path.stat().st_size} bytes, more than a library file may "
                            f"({MAX_FILE_BYTES})")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return _read_conn(conn, path)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise PortableError(f"{path} is not an experience library ({exc})") from None


def _read_conn(conn: sqlite3.Connection, path: Path) -> Portable:
    have = _tables(conn)
    if "entries" not in have:
        raise PortableError(f"{path} is not an experience library (no entries table)")
    prov, settings = run_provenance(path)
    stored = _stored_settings(conn, have)
    settings = {**stored, **settings}  # a run folder's config names the settings its library was made with
    links: dict[int, list[int]] = {}
    for eid, cid in conn.execute("SELECT entry_id, cluster_id FROM entry_clusters ORDER BY rowid"):
        if not isinstance(eid, int) or not isinstance(cid, int):
            raise PortableError(f"{path}: entry_clusters: expected integer ids, got {eid!r:.30}, {cid!r:.30}")
        links.setdefault(eid, []).append(cid)
    origin: dict[int, Any] = {}
    if "entry_origin" in have:
        for eid, o in conn.execute("SELECT entry_id, origin FROM entry_origin"):
            try:
                origin[eid] = json.loads(o)
            except (TypeError, ValueError, RecursionError):
                raise PortableError(f"{path}: entry_origin row {eid!r:.30}: origin is not JSON") from None
    clusters: dict[int, dict[str, Any]] = {}
    if "obs_clusters" in have:
        try:
            meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM obs_meta")}
        except (TypeError, ValueError, RecursionError):
            raise PortableError(f"{path}: obs_meta: a value is not JSON") from None
        threshold = meta.get("threshold", _DEFAULTS["cluster_threshold"])
        settings.setdefault("cluster_threshold", threshold)
        for cid, tt, proto, size in conn.execute("SELECT cid, task_type, prototype, size FROM obs_clusters"):
            try:
                clusters[cid] = _checked_cluster({"id": cid, "task_type": tt, "prototype": proto, "size": size})
            except _Bad as exc:
                raise PortableError(f"{path}: obs_clusters row {cid!r:.30}: {exc}") from None
    entries = []
    for row in conn.execute(f"SELECT {', '.join(_COLS)} FROM entries ORDER BY id"):
        d = dict(zip(_COLS, row))
        try:
            try:
                d["sources"] = json.loads(d["sources"])
            except (TypeError, ValueError, RecursionError):
                raise _Bad("sources", "not a JSON list") from None
            d["clusters"] = links.get(d["id"], [])
            o = origin.get(d["id"])
            if o is not None:
                if not isinstance(o, dict):
                    raise _Bad("origin", "expected an object")
                d["provenance"] = {k: o.get(k) for k in PROVENANCE_KEYS}
                d["merged"] = o.get("merged")
            entries.append(_checked_entry(d, prov))
        except _Bad as exc:
            raise PortableError(f"{path}: entries row {d.get('id')!r:.30}: {exc}") from None
    settings = check_settings(settings, f"{path}: settings")
    linked = {c for e in entries for c in e["clusters"]}
    return Portable(prov, {**_DEFAULTS, **settings}, [clusters[c] for c in sorted(linked) if c in clusters],
                    entries)


def _stored_settings(conn: sqlite3.Connection, have: set[str]) -> dict[str, Any]:
    """The settings an import made this library file with (``library_meta``), if any."""
    if "library_meta" not in have:
        return {}
    row = conn.execute("SELECT value FROM library_meta WHERE key = ?", (_SETTINGS_KEY,)).fetchone()
    try:
        got = json.loads(row[0]) if row else {}
    except (TypeError, ValueError, RecursionError):
        return {}
    return got if isinstance(got, dict) else {}


def read_jsonl(path: str | Path, strict: bool = False) -> Portable:
    """A JSONL export as records, every field checked and capped (:func:`_checked_entry`). A line that is not
    JSON or whose field does not fit is counted and skipped, or with ``strict`` a ``PortableError`` naming the
    line and the field; a file with a foreign header, bad settings or no entry at all is a ``PortableError``.
    Lines without ``kind`` are entries (the plain ``Entry`` dicts of ``ExperienceLibrary.export_jsonl``)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise PortableError(f"{path} has {path.stat().st_size} bytes, more than a library export may "
                                f"({MAX_FILE_BYTES})")
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PortableError(f"cannot read {path} ({type(exc).__name__})") from None
    out = Portable(settings=dict(_DEFAULTS))
    bad = 0
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            try:
                d = json.loads(line)
            except RecursionError:
                raise _Bad("line", "JSON nested too deeply") from None
            except ValueError as exc:
                raise _Bad("line", f"not JSON ({exc})") from None
            if not isinstance(d, dict):
                raise _Bad("line", f"expected a JSON object, got {type(d).__name__}")
            kind = d.get("kind", "entry")
            if kind == "header":
                if d.get("format") != FORMAT or n != 0:
                    raise PortableError(f"{path} is not a slea library export (header format "
                                        f"{d.get('format')!r:.40})")
                try:
                    out.provenance = _provenance(d.get("provenance") or {})
                except _Bad as exc:
                    raise PortableError(f"{path}: line 1 (header): {exc}") from None
                out.settings.update(check_settings(d.get("settings") or {}, f"{path}: line 1 (header): settings"))
            elif kind == "cluster":
                out.clusters.append(_checked_cluster(d))
            elif kind == "entry":
                out.entries.append(_checked_entry(d, out.provenance))
            else:
                raise _Bad("kind", f"expected header, cluster or entry, got {kind!r:.40}")
        except _Bad as exc:
            if strict:
                raise PortableError(f"{path}: line {n + 1}: {exc}") from None
            bad += 1
    if not out.entries and (bad or not lines):
        raise PortableError(f"{path} is not a slea library export (no valid entry line)")
    out.malformed = bad
    return out


def load(source: str | Path, strict: bool = False) -> Portable:
    """Any library source: a run folder (its ``library.sqlite``), an SQLite library, or a JSONL export
    (``strict``: a malformed line is an error rather than counted and skipped)."""
    source = Path(source)
    if source.is_dir():
        if not RunFolder(source).library.is_file():
            raise PortableError(f"no experience library at {RunFolder(source).library}")
        return read_library(RunFolder(source).library)
    if not source.is_file():
        raise PortableError(f"no such file: {source}")
    if source.suffix in (".jsonl", ".json"):
        return read_jsonl(source, strict)
    return read_library(source)


def working_copy(source: str | Path, dest: str | Path) -> Portable:
    """A private library file ``dest`` made from any source, for a run that will retrieve from it (retrieval
    links entries and opens clusters) or evolve it: an SQLite library is copied whole (SQLite's online backup:
    the index and its memo included), a JSONL export imported (:func:`import_into`). Returns the source's
    records (settings, provenance)."""
    source, dest = Path(source), Path(dest)
    lib = load(source)
    for p in (dest, dest.with_name(dest.name + "-wal"), dest.with_name(dest.name + "-shm")):
        p.unlink(missing_ok=True)
    if source.suffix in (".jsonl", ".json"):
        import_into(lib, dest)
        return lib
    snapshot_sqlite(RunFolder(source).library if source.is_dir() else source, dest)
    return lib


# -- writing -------------------------------------------------------------------------------------------------------
def write_jsonl(lib: Portable, out: str | Path) -> int:
    """Header, clusters, entries; returns the number of entries written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = {"kind": "header", "format": FORMAT, "version": VERSION,
              "provenance": {k: lib.provenance.get(k) for k in PROVENANCE_KEYS},
              "settings": {k: lib.settings.get(k, _DEFAULTS[k]) for k in SETTING_KEYS}}
    with out.open("w", encoding="utf-8") as f:
        for rec in [header, *({"kind": "cluster", **c} for c in lib.clusters),
                    *({"kind": "entry", **e} for e in lib.entries)]:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return len(lib.entries)


def destination_settings(dest: str | Path) -> dict[str, Any] | None:
    """The settings of an existing library file: its run folder's config, else what the import that made it
    stored, else the library's defaults; None when ``dest`` does not exist yet."""
    if not Path(dest).exists():
        return None
    return read_library(dest).settings  # a PortableError unless it is a library


def import_into(lib: Portable, dest: str | Path, settings: dict[str, Any] | None = None, *,
                allow_evict: bool = False) -> dict[str, int]:
    """Add every entry of ``lib`` to the library file ``dest`` (created if missing) through the library's
    admission path, in one transaction. Returns counts: added, replaced (of those, evicted: entries the
    destination held before), duplicate, rejected, malformed, links (entry-cluster links carried over,
    remapped), clusters_new (clusters opened in the destination's index).

    Settings (capacities, novelty and cluster thresholds): ``settings`` when given, else an existing
    destination's own (:func:`destination_settings`: the file's never override them), else, for a new file,
    ``lib.settings`` (then stored in it). An import that would evict entries the destination held is a
    ``PortableError`` saying how many, and changes nothing, unless ``allow_evict``."""
    have = destination_settings(dest)
    s = {**_DEFAULTS, **(have if have is not None else lib.settings), **(settings or {})}
    s = {**s, **check_settings(s)}
    target = ExperienceLibrary(dest, capacity_pos=s["capacity_pos"], capacity_neg=s["capacity_neg"],
                               novelty_threshold=s["novelty_threshold"])
    counts: Counter = Counter(malformed=lib.malformed)
    home = run_provenance(dest)[0]  # the provenance of the destination's own entries (its run folder, if any)
    held = {e.id for e in target.entries()}
    try:
        fresh = "obs_clusters" not in _tables(target.conn)
        index = ObservationIndex.load_sqlite(target.conn, **({"threshold": s["cluster_threshold"]} if fresh else {}))
        with target.transaction() as conn:
            conn.execute(_ORIGIN_SCHEMA)
            if have is None:  # a new file keeps the settings it was made with
                conn.execute("INSERT OR REPLACE INTO library_meta(key, value) VALUES (?, ?)",
                             (_SETTINGS_KEY, json.dumps({k: s[k] for k in SETTING_KEYS})))
            remap = {}
            linked = {c for e in lib.entries for c in e["clusters"]}
            for c in sorted(lib.clusters, key=lambda c: c["id"]):  # source order: the same joins as there
                if c["id"] not in linked:
                    continue  # a cluster no entry links to brings nothing
                before = len(index)
                remap[c["id"]] = index.assign(c["prototype"], c["task_type"])
                counts["clusters_new"] += len(index) > before
            for e in lib.entries:
                _import_entry(target, conn, e, [remap[c] for c in e["clusters"] if c in remap], counts, home, held)
            if counts["evicted"] and not allow_evict:
                raise PortableError(f"importing would evict {counts['evicted']} of the {len(held)} entries {dest} "
                                    f"holds (higher-scored imports replace the lowest in full zones); nothing was "
                                    f"changed (allow it with --allow-evict)")
            index.save_sqlite(conn)
    finally:
        target.close()
    return dict(counts)


def _import_entry(target: ExperienceLibrary, conn: sqlite3.Connection, e: dict[str, Any], clusters: list[int],
                  counts: Counter, home: dict[str, Any], held: set[int]) -> None:
    res = target.add(e["text"], e["zone"], e["level"], e["score"], task_type=e["task_type"],
                     context=e["context"], sources=e["sources"], clusters=clusters, iteration=e["created_iter"])
    counts[res.status] += 1
    if res.replaced_id is not None and res.replaced_id in held:
        counts["evicted"] += 1
    if res.entry_id is None:
        return
    counts["links"] += len(clusters)
    origin = {**e["provenance"], **({"merged": e["merged"]} if e.get("merged") else {})}
    if res.status == "duplicate":  # the existing entry keeps its own provenance and records this one
        row = conn.execute("SELECT origin FROM entry_origin WHERE entry_id = ?", (res.entry_id,)).fetchone()
        old = json.loads(row[0]) if row else {**home, "iteration": target.get(res.entry_id).created_iter}
        merged = old.get("merged", [])
        if e["provenance"] not in merged and e["provenance"] != {k: old.get(k) for k in PROVENANCE_KEYS}:
            old["merged"] = (merged + [e["provenance"]])[-8:]
            conn.execute("INSERT OR REPLACE INTO entry_origin(entry_id, origin) VALUES (?, ?)",
                         (res.entry_id, json.dumps(old)))
        return
    target.set_usage(res.entry_id, usage=e["usage"], success=e["success"], last_used_iter=e["last_used_iter"])
    conn.execute("INSERT OR REPLACE INTO entry_origin(entry_id, origin) VALUES (?, ?)",
                 (res.entry_id, json.dumps(origin)))


def merged_settings(libs: list[Portable]) -> dict[str, Any]:
    """Settings of a merge: the first library's thresholds, the largest capacities of all."""
    s = {**_DEFAULTS, **libs[0].settings}
    for z in ("capacity_pos", "capacity_neg"):
        s[z] = max(int(p.settings.get(z, _DEFAULTS[z])) for p in libs)
    return s


def merge(libs: list[Portable], out: str | Path, names: list[str] | None = None
          ) -> tuple[list[dict[str, int]], Portable]:
    """A new library ``out`` (``.sqlite``, or ``.jsonl``: written through a temporary SQLite file) holding
    ``libs`` imported in order with :func:`merged_settings`; returns the import counts per library and the
    merged library as records. ``names`` (default: each library's run) make up a JSONL's provenance."""
    import tempfile

    out = Path(out)
    if out.exists():
        raise PortableError(f"{out} exists (a merge writes a new library)")
    settings = merged_settings(libs)
    with tempfile.TemporaryDirectory() as work:
        db = out if out.suffix != ".jsonl" else Path(work) / "merged.sqlite"
        # a new file: a later library's entries may replace an earlier one's (the merge's own admission)
        counts = [import_into(p, db, settings, allow_evict=True) for p in libs]
        merged = read_library(db)
        merged.settings = settings
        if out.suffix == ".jsonl":
            names = names or [str(p.provenance.get("run")) for p in libs]
            merged.provenance = {"run": "merge of " + ", ".join(names)}
            write_jsonl(merged, out)
    return counts, merged


# -- diff ----------------------------------------------------------------------------------------------------------
CHANGE_FIELDS = ("text", "level", "score", "usage", "success", "links")


@dataclass
class EntryChange:
    kind: str  # "added" | "removed" | "changed"
    zone: str
    level: str
    a: dict[str, Any] | None  # the entry in A (None: added)
    b: dict[str, Any] | None  # the entry in B (None: removed)
    fields: list[str] = field(default_factory=list)  # what changed (CHANGE_FIELDS)


@dataclass
class LibraryDiff:
    changes: list[EntryChange]
    same: Counter  # (zone, level) -> entries present in both, unchanged

    def counts(self) -> dict[tuple[str, str], dict[str, int]]:
        """(zone, level) -> added, removed, changed, same (every zone and level, zeros included)."""
        out = {(z, lv): {"added": 0, "removed": 0, "changed": 0, "same": self.same[(z, lv)]}
               for z in ZONES for lv in LEVELS}
        for c in self.changes:
            out[(c.zone, c.level)][c.kind] += 1
        return out


def _changed(a: dict[str, Any], b: dict[str, Any], la: Portable, lb: Portable) -> list[str]:
    got = [k for k in ("text", "level", "usage", "success") if a[k] != b[k]]
    if not math.isclose(a["score"], b["score"], rel_tol=1e-9, abs_tol=1e-12):
        got.append("score")
    if la.prototypes(a) != lb.prototypes(b):
        got.append("links")
    return [f for f in CHANGE_FIELDS if f in got]


def diff(a: Portable, b: Portable, novelty_threshold: float | None = None) -> LibraryDiff:
    """What B adds, removes and changes relative to A. An entry of B is the same entry as one of A when it
    duplicates it by the library's novelty rule (:meth:`ExperienceLibrary.find_duplicate`, same zone and task
    type); it is *changed* when its text, level, score, usage, success or linked clusters (by prototype) differ.
    A change is filed under B's zone and level (A's for a removal)."""
    thr = float(novelty_threshold if novelty_threshold is not None else a.settings.get("novelty_threshold", 0.85))
    probe = ExperienceLibrary(None, capacity_pos=1 << 30, capacity_neg=1 << 30, novelty_threshold=thr)
    owners: dict[int, list[dict[str, Any]]] = {}
    try:
        for e in a.entries:
            r = probe.add(e["text"], e["zone"], e["level"], e["score"], task_type=e["task_type"])
            if r.entry_id is not None:
                owners.setdefault(r.entry_id, []).append(e)
        changes: list[EntryChange] = []
        same: Counter = Counter()
        for e in b.entries:
            hit = probe.find_duplicate(e["text"], e["zone"], e["task_type"])
            pool = owners.get(hit, []) if hit is not None else []
            if not pool:
                changes.append(EntryChange("added", e["zone"], e["level"], None, e))
                continue
            old = pool.pop(0)
            fields = _changed(old, e, a, b)
            if fields:
                changes.append(EntryChange("changed", e["zone"], e["level"], old, e, fields))
            else:
                same[(e["zone"], e["level"])] += 1
        for left in owners.values():
            changes.extend(EntryChange("removed", e["zone"], e["level"], e, None) for e in left)
    finally:
        probe.close()
    return LibraryDiff(changes, same)
