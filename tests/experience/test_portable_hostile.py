"""Library imports never destroy (docs/reliability.md, the audit's rows 9 and 10): the destination's settings win
over the file's, an import that would evict what the destination holds is refused (saying how many) unless
allowed, every field of a JSONL or SQLite source is validated (one line naming it, exit 2, destination unchanged)
and every text is capped, prototypes included."""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from pathlib import Path

import pytest

from slea.experience.library import ExperienceLibrary
from slea.experience.portable import (
    MAX_PROTOTYPE,
    PortableError,
    destination_settings,
    import_into,
    load,
    read_jsonl,
)

HEADER = {"kind": "header", "format": "slea-library", "version": 1, "provenance": {"run": "evil"}}


WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "amber", "basil", "cedar", "dune", "ember", "fern", "grove", "heath", "iris", "jade", "kelp", "lotus", "moss", "nectar"]


def _entry(i: int, score: float, **kw) -> dict:
    """A pattern of the strategy zone whose text no other ``i``'s duplicates (the novelty test)."""
    text = " ".join(random.Random(i).sample(WORDS, 8)).capitalize() + "."
    return {"kind": "entry", "text": text, "zone": "pos", "level": "pattern", "score": score, **kw}


def _write(path: Path, header: dict | None, lines: list) -> Path:
    rows = ([header] if header else []) + lines
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _digest(path: Path) -> tuple[str, list]:
    lib = ExperienceLibrary(path)
    try:
        entries = sorted((e.id, e.text, e.score) for e in lib.entries())
    finally:
        lib.conn.close()
    return hashlib.sha256(path.read_bytes()).hexdigest(), entries


@pytest.fixture
def dest(tmp_path) -> Path:
    """A library of 27 entries (5 in pos/pattern, a full level: it was made with capacity_pos 5)."""
    src = _write(tmp_path / "own.jsonl", {**HEADER, "settings": {"capacity_pos": 5}},
                 [_entry(i, 1.0) for i in range(5)] +
                 [{**_entry(100 + i, 0.5), "zone": "neg", "level": "example"} for i in range(22)])
    out = tmp_path / "dest.sqlite"
    counts = import_into(read_jsonl(src), out)
    assert counts["added"] == 27
    return out


def test_the_audits_import_is_refused_in_one_line_and_the_destination_is_unchanged(dest, tmp_path, slea_cli):
    evil = _write(tmp_path / "evil.jsonl", {**HEADER, "settings": {"capacity_pos": 1}},
                  [_entry(200 + i, 1e300) for i in range(40)])
    before = _digest(dest)
    r = slea_cli("library", "import", evil, dest)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "line 2: score: expected a finite number" in r.stderr
    assert _digest(dest) == before


def test_an_evicting_import_is_refused_saying_how_many_unless_allowed(dest, tmp_path, slea_cli):
    better = _write(tmp_path / "better.jsonl", {**HEADER, "settings": {"capacity_pos": 1}},
                    [_entry(300 + i, 9.0) for i in range(3)])
    before = _digest(dest)
    r = slea_cli("library", "import", better, dest)
    assert r.returncode == 2 and "would evict 3 of the 27 entries" in r.stderr and "--allow-evict" in r.stderr
    assert _digest(dest) == before  # nothing changed, the file's bytes included
    with pytest.raises(PortableError, match="would evict 3"):
        import_into(read_jsonl(better), dest)
    assert destination_settings(dest)["capacity_pos"] == 5  # the destination's, not the file's 1
    r = slea_cli("library", "import", better, dest, "--allow-evict")
    assert r.returncode == 0, r.stderr
    lib = ExperienceLibrary(dest)
    try:  # the destination's capacity (5) held: three replaced, not 1 kept as the file's header asked
        assert lib.size("pos", "pattern") == 5 and len(lib) == 27
        assert sorted(e.score for e in lib.entries("pos")) == [1.0, 1.0, 9.0, 9.0, 9.0]
    finally:
        lib.conn.close()


def test_a_new_destination_takes_the_files_validated_settings(tmp_path):
    src = _write(tmp_path / "s.jsonl", {**HEADER, "settings": {"capacity_pos": 2, "novelty_threshold": 0.9}},
                 [_entry(i, float(i)) for i in range(4)])
    counts = import_into(read_jsonl(src), tmp_path / "new.sqlite")
    assert counts["added"] == 2 and counts["replaced"] == 2 and "evicted" not in counts  # its own entries only
    assert destination_settings(tmp_path / "new.sqlite")["capacity_pos"] == 2


@pytest.mark.parametrize(("line", "needle"), [
    ("[" * 100_000, "line 2: line: JSON nested too deeply"),
    (json.dumps({**_entry(1, 1.0), "zone": "evil"}), "line 2: zone: expected one of pos, neg"),
    (json.dumps({**_entry(1, 1.0), "usage": "many"}), "line 2: usage: expected an integer"),
    (json.dumps({**_entry(1, 1.0), "clusters": ["x"]}), "line 2: clusters: expected an integer"),
    (json.dumps({**_entry(1, 1.0), "provenance": "me"}), "line 2: provenance: expected an object"),
    (json.dumps({"kind": "cluster", "id": 1}), "line 2: prototype: expected text"),
    (json.dumps({"kind": "shrug"}), "line 2: kind: expected header, cluster or entry"),
])
def test_every_malformed_line_is_named_and_changes_nothing(dest, tmp_path, slea_cli, line, needle):
    bad = _write(tmp_path / "bad.jsonl", HEADER, [line, {**_entry(400, 2.0), "level": "principle"}])
    before = _digest(dest)
    r = slea_cli("library", "import", bad, dest)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-500:]
    assert len(r.stderr.strip().splitlines()) == 1
    assert _digest(dest) == before
    lenient = slea_cli("library", "import", bad, dest, "--skip-malformed")  # the line counted and skipped
    assert lenient.returncode == 0 and read_jsonl(bad).malformed == 1


@pytest.mark.parametrize(("settings", "needle"), [
    ({"capacity_pos": "abc"}, "settings.capacity_pos: expected an integer in 1..1000000, got 'abc'"),
    ({"capacity_neg": 0}, "settings.capacity_neg: expected an integer"),
    ({"novelty_threshold": 7}, "settings.novelty_threshold: expected a number in (0, 1]"),
])
def test_bad_header_settings_are_named(tmp_path, slea_cli, settings, needle):
    bad = _write(tmp_path / "bad.jsonl", {**HEADER, "settings": settings}, [_entry(1, 1.0)])
    with pytest.raises(PortableError, match="line 1 \\(header\\)"):
        load(bad)
    r = slea_cli("library", "import", bad, tmp_path / "x.sqlite")
    assert r.returncode == 2 and needle in r.stderr and not (tmp_path / "x.sqlite").exists()


def test_an_sqlite_source_with_a_bad_row_is_named_by_import_and_show(dest, tmp_path, slea_cli):
    evil = tmp_path / "evil.sqlite"
    lib = ExperienceLibrary(evil)
    lib.add("Open the chest with the brass key.", "pos", "pattern", 1.0)
    lib.close()
    with sqlite3.connect(evil) as conn:
        conn.execute("UPDATE entries SET zone = 'evil'")
    before = _digest(dest)
    r = slea_cli("library", "import", evil, dest)
    assert r.returncode == 2 and "entries row 1: zone: expected one of pos, neg, got 'evil'" in r.stderr
    assert _digest(dest) == before
    show = slea_cli("library", "show", evil)
    assert show.returncode == 2 and "zone" in show.stderr and "Traceback" not in show.stderr
    assert len(show.stderr.strip().splitlines()) == 1


def test_every_text_is_capped_prototypes_included(dest, tmp_path):
    huge = "look around the cellar " * 500_000  # ~11.5 MB
    src = _write(tmp_path / "big.jsonl", HEADER, [
        {"kind": "cluster", "id": 1, "task_type": "t" * 10_000, "prototype": huge},
        {**_entry(500, 0.2), "zone": "neg", "level": "principle", "text": huge, "context": huge,
         "task_type": "t" * 10_000, "clusters": [1], "provenance": {"run": "r" * 100_000, "model": "m"},
         "merged": [{"run": f"m{i}" * 1000} for i in range(1000)]}])
    size = dest.stat().st_size
    counts = import_into(read_jsonl(src), dest)
    assert counts["added"] == 1 and counts["links"] == 1
    for p in (dest, Path(f"{dest}-wal")):
        size_after = dest.stat().st_size + (p.stat().st_size if p != dest and p.exists() else 0)
    assert size_after - size < 200_000  # a 10 MB prototype once grew a library 94 kB -> 31.6 MB
    got = next(e for e in load(dest).entries if e["zone"] == "neg" and e["level"] == "principle")
    assert len(got["text"]) <= 600 and len(got["context"]) <= 300 and len(got["task_type"]) <= 100
    assert len(got["provenance"]["run"]) <= 200 and len(got["merged"]) <= 8
    assert all(len(m["run"]) <= 200 for m in got["merged"])
    with sqlite3.connect(dest) as conn:
        longest = conn.execute("SELECT max(length(prototype)) FROM obs_clusters").fetchone()[0]
    assert longest <= MAX_PROTOTYPE
