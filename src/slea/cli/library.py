"""``slea library``: show, search, export, import, merge and diff experience libraries."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from slea.cli.common import console, fail, plain
from slea.runs.folder import RunFolder

library_app = typer.Typer(no_args_is_help=True, help="Inspect, export, import, merge and diff experience "
                          "libraries.")


def _library_path(run: Path) -> Path:
    path = RunFolder(run).library if run.is_dir() else run
    if not path.is_file():
        raise fail(f"no experience library at {path} (only runs with a library have one: algorithm slea, or "
                    f"experience.mode step/task)")
    from slea.experience.inspect import check_library

    try:
        check_library(path)
    except ValueError as exc:
        raise fail(str(exc)) from None
    return path


@library_app.command("show")
def library_show(run: Path, zone: str | None = None, limit: int = 30,
                 full: bool = typer.Option(False, "--full", help="every entry's whole text, wrapped (default: one "
                                           "line per entry, cut at the terminal's width)")) -> None:
    """List library entries with zone, level, score, usage and linked clusters."""
    from slea.experience.inspect import cluster_summary, list_entries

    path = _library_path(run)
    rows = list_entries(path, zone=zone, limit=limit)
    cols = ("id", "zone", "level", "score", "used", "won", "clusters")
    cells = [[str(r.get("id")), str(r.get("zone")), str(r.get("level")), f"{r.get('score', 0):.2f}",
              str(r.get("usage", r.get("usage_count", ""))), str(r.get("success", r.get("success_count", ""))),
              ",".join(map(str, list(r.get("clusters", [])))) or "-"] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    widths[-1] = min(widths[-1], 12)  # a long cluster list is cut ("…")
    # the text takes what the terminal has left (each column adds 3 characters of border and padding): one line
    # per entry, cut with "…", or all of it with --full
    text_width = max(16, console.width - sum(widths) - 3 * (len(cols) + 1) - 1)
    t = Table(title=f"experience library ({len(rows)} shown)")
    for col, w in zip(cols, widths):
        t.add_column(col, no_wrap=True, min_width=w, max_width=w, overflow="ellipsis",
                     justify="right" if col in ("id", "score", "used", "won") else "left")
    t.add_column("text", width=text_width, no_wrap=not full, overflow="fold" if full else "ellipsis")
    cut = False
    for r, row in zip(rows, cells):
        text = " ".join(str(r.get("text", "")).split())
        t.add_row(*row, text)
        cut |= not full and len(text) > text_width
    if cut:
        t.caption = "text cut at the terminal's width: --full shows all of it"
    console.print(t)
    c = cluster_summary(path)
    plain(f"clusters: {c['clusters']} on {c['built_on']}, {c['members']:.2f} members each on average, "
          f"{c['singletons']:.0%} with one member")


@library_app.command("search")
def library_search(run: Path, text: str, task_type: str = "") -> None:
    """Show what an observation would retrieve from the library."""
    from slea.experience.inspect import search

    res = search(_library_path(run), text, task_type=task_type)
    console.print(f"cluster {res.cluster_id}, entries {res.entry_ids}")
    console.print(res.text or "(nothing retrieved)", markup=False)


def portable(what: str, source: Path, strict: bool = False):
    """A library source (run folder, SQLite library or JSONL export) as records, or one line and exit 2
    (``strict``: also for a malformed JSONL line, which is otherwise counted and skipped)."""
    from slea.experience.portable import PortableError, load

    try:
        return load(source, strict)
    except PortableError as exc:
        raise fail(f"{what}: {exc}") from None


def _provenance_line(p: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in p.items() if v is not None) or "unknown provenance"


@library_app.command("export")
def library_export(source: Path = typer.Argument(..., help="a run folder or an SQLite library"),
                   out: Path = typer.Argument(..., help="the JSONL file to write")) -> None:
    """Export a library as JSONL, with its provenance.

    A header (run, model, env, algorithm, iteration; settings), the observation clusters its entries link to,
    and the entries, each with its own provenance."""
    from slea.experience.portable import write_jsonl

    lib = portable("export", source)
    write_jsonl(lib, out)
    plain(f"wrote {len(lib.entries)} entries and {len(lib.clusters)} clusters to {out} "
          f"({_provenance_line(lib.provenance)})")


def _counts_table(title: str, rows: list[tuple[str, dict]]) -> Table:
    cols = ("added", "replaced", "evicted", "duplicate", "rejected", "malformed", "links", "clusters_new")
    t = Table(title=title)
    t.add_column("source")
    for c in cols:
        t.add_column(c, justify="right")
    for name, counts in rows:
        t.add_row(name, *(str(counts.get(c, 0)) for c in cols))
    return t


@library_app.command("import")
def library_import(source: Path = typer.Argument(..., help="a JSONL export (or a run folder / SQLite library)"),
                   dest: Path = typer.Argument(..., help="the SQLite library to add to (created if missing), "
                                                         "or a run folder (its library.sqlite)"),
                   allow_evict: bool = typer.Option(False, "--allow-evict", help="let imported entries replace "
                                                    "lower-scored ones the destination holds (default: refused)"),
                   skip_malformed: bool = typer.Option(False, "--skip-malformed", help="count and skip JSONL lines "
                                                       "that do not validate (default: refused, naming the line)")
                   ) -> None:
    """Add a library's entries to another library, never destroying what it holds.

    Through the library's own admission path (novelty test: duplicates merge into the existing entry; capacity
    per zone and level) with the destination's own settings; cluster links are remapped by prototype. Every
    field of the source is checked first; an import that would evict existing entries is refused (how many is
    said) unless --allow-evict."""
    import sqlite3

    from slea.experience.portable import PortableError, import_into

    lib = portable("import", source, strict=not skip_malformed)
    target = RunFolder(dest).library if dest.is_dir() else dest
    try:
        counts = import_into(lib, target, allow_evict=allow_evict)
    except PortableError as exc:
        raise fail(f"import: {exc}") from None
    except (sqlite3.Error, OSError) as exc:
        raise fail(f"import: cannot write {target} ({type(exc).__name__}: {exc})") from None
    console.print(_counts_table(f"imported into {target}", [(str(source), counts)]))


@library_app.command("merge")
def library_merge(sources: list[Path] = typer.Argument(..., help="two or more run folders, SQLite libraries "
                                                                  "or JSONL exports, merged in this order"),
                  out: Path = typer.Option(..., "--out", help="the new library: .sqlite, or .jsonl"),
                  skip_malformed: bool = typer.Option(False, "--skip-malformed", help="count and skip JSONL lines "
                                                      "that do not validate (default: refused, naming the line)")
                  ) -> None:
    """Merge libraries into a new one, de-duplicated by the library's novelty rule.

    The first source's thresholds and the largest capacities apply."""
    from slea.experience.portable import PortableError, merge

    if len(sources) < 2:
        raise fail("merge: give at least two libraries")
    libs = [portable("merge", s, strict=not skip_malformed) for s in sources]
    names = [str(lib.provenance.get("run") or s) for s, lib in zip(sources, libs)]
    try:
        counts, merged = merge(libs, out, names)
    except PortableError as exc:
        raise fail(f"merge: {exc}") from None
    console.print(_counts_table(f"merged into {out}: {len(merged.entries)} entries", list(zip(names, counts))))


def _cell(entry: dict | None, key: str) -> str:
    if entry is None:
        return "-"
    return f"{entry[key]:.2f}" if key == "score" else str(entry[key])


@library_app.command("diff")
def library_diff(a: Path = typer.Argument(..., help="the library before (run folder, SQLite or JSONL)"),
                 b: Path = typer.Argument(..., help="the library after"),
                 limit: int = typer.Option(20, help="changed entries listed (0: counts only)")) -> None:
    """Entries added, removed and changed from library A to B, by zone and level.

    An entry of B that duplicates one of A by the library's novelty rule is the same entry."""
    from slea.experience.portable import diff

    la, lb = portable("diff", a), portable("diff", b)
    d = diff(la, lb)
    t = Table(title=f"library diff: {len(la.entries)} -> {len(lb.entries)} entries")
    for col in ("zone", "level", "added", "removed", "changed", "same"):
        t.add_column(col, justify="right" if col not in ("zone", "level") else "left")
    for (zone, level), c in d.counts().items():
        t.add_row(zone, level, *(str(c[k]) for k in ("added", "removed", "changed", "same")))
    console.print(t)
    if limit <= 0 or not d.changes:
        return
    order = {"added": 0, "removed": 1, "changed": 2}
    rows = sorted(d.changes, key=lambda c: (order[c.kind], c.zone, c.level))[:limit]
    e = Table(title=f"changed entries ({len(rows)} of {len(d.changes)} shown)")
    for col in ("", "zone level", "task type", "score", "used", "what changed"):
        e.add_column(col, overflow="fold")
    e.add_column("text", ratio=1)
    for c in rows:
        e.add_row(c.kind, f"{c.zone} {c.level}", (c.b or c.a)["task_type"] or "-",
                  f"{_cell(c.a, 'score')} -> {_cell(c.b, 'score')}",
                  f"{_cell(c.a, 'usage')} -> {_cell(c.b, 'usage')}", " ".join(c.fields),
                  str((c.b or c.a)["text"])[:100])
    console.print(e)
