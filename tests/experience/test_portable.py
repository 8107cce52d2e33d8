"""Portable libraries: JSONL round trip with provenance and cluster links, merge de-duplication, diff."""

from __future__ import annotations

import json
import sqlite3

import pytest

from slea.experience.clustering import ObservationIndex
from slea.experience.library import ExperienceLibrary
from slea.experience.portable import (
    PortableError,
    diff,
    import_into,
    load,
    merge,
    read_jsonl,
    read_library,
    working_copy,
    write_jsonl,
)

KITCHEN = "-= Kitchen =- You are in a kitchen. There is a closed fridge and a table with a cookbook on it."
HALL = "-= Hall =- A long hall. Exits lead north and west. A rusty key lies on the floor here."


def _run_folder(tmp_path, name="run-a"):
    """A run folder as the trainer writes it: config.yaml, metrics.jsonl (last iteration 7), library.sqlite."""
    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text(
        f"run:\n  name: {name}\nmodel:\n  name_or_path: embedded\nenv:\n  id: slea/TextWorld-v0\n"
        "algorithm:\n  name: slea\nexperience:\n  capacity_pos: 7\n  capacity_neg: 5\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i}) + "\n" for i in range(8))
                                       + "{truncated\n")
    lib = ExperienceLibrary(run / "library.sqlite")
    index = ObservationIndex()
    kitchen, hall = index.assign(KITCHEN, "cooking"), index.assign(HALL, "cooking")
    index.assign("An unrelated observation nobody links to, about a garden with a pond.", "cooking")
    a = lib.add("Open the fridge before looking for food.", "pos", "example", 1.0, task_type="cooking",
                context="kitchen", sources=[3], clusters=[kitchen], iteration=2)
    b = lib.add("Never go west from the hall: it is a dead end.", "neg", "principle", -0.5,
                task_type="cooking", clusters=[kitchen, hall], iteration=5)
    lib.record_usage(a.entry_id, success=True, iteration=6)
    lib.record_usage(b.entry_id, success=False, iteration=7)
    with lib.transaction() as conn:
        index.save_sqlite(conn)
    lib.close()
    return run


def _key(e):
    return (e["text"], e["zone"], e["level"], e["score"], e["task_type"], e["context"], e["sources"], e["usage"],
            e["success"], e["created_iter"], e["last_used_iter"])


def test_jsonl_round_trip_keeps_entries_scores_levels_links_and_provenance(tmp_path):
    run = _run_folder(tmp_path)
    src = load(run)
    # provenance from the run folder: config (run, model, env, algorithm) and the last iteration logged (7; the
    # truncated metrics line is skipped); each entry's iteration is the one it was created in
    assert src.provenance == {"run": "run-a", "model": "embedded", "env": "slea/TextWorld-v0",
                              "algorithm": "slea", "iteration": 7}
    assert sorted(e["provenance"]["iteration"] for e in src.entries) == [2, 5]
    assert src.settings["capacity_pos"] == 7 and src.settings["capacity_neg"] == 5
    assert len(src.clusters) == 2  # the unlinked garden cluster is not exported

    out = tmp_path / "lib.jsonl"
    assert write_jsonl(src, out) == 2
    kinds = [json.loads(x)["kind"] for x in out.read_text().splitlines()]
    assert kinds == ["header", "cluster", "cluster", "entry", "entry"]
    counts = import_into(read_jsonl(out), tmp_path / "copy.sqlite")
    assert counts["added"] == 2 and counts["clusters_new"] == 2 and counts["links"] == 3

    back = read_library(tmp_path / "copy.sqlite")
    assert sorted(map(_key, back.entries)) == sorted(map(_key, src.entries))
    by_text = {e["text"]: e for e in back.entries}
    for e in src.entries:  # cluster links, compared by what they mean: the clusters' prototypes
        assert back.prototypes(by_text[e["text"]]) == src.prototypes(e) != []
    assert back.prototypes(by_text["Never go west from the hall: it is a dead end."]) == sorted([KITCHEN, HALL])
    # the copy is in no run folder: its entries keep the provenance they were exported with
    assert back.provenance == {}
    assert {e["text"]: e["provenance"] for e in back.entries} == {e["text"]: e["provenance"] for e in src.entries}
    # the copy retrieves like the original: its index maps the kitchen observation to the linked cluster
    lib = ExperienceLibrary(tmp_path / "copy.sqlite")
    index = ObservationIndex.load_sqlite(lib.conn)
    cid = index.lookup(KITCHEN, "cooking")
    assert sorted(lib.get(i).text for i in lib.linked(cid, "pos") + lib.linked(cid, "neg")) == sorted(by_text)
    lib.close()


def test_import_remaps_links_to_a_similar_cluster_of_the_destination(tmp_path):
    run = _run_folder(tmp_path)
    dest = ExperienceLibrary(tmp_path / "dest.sqlite")
    index = ObservationIndex()
    index.assign("first observation of the destination, nothing like a kitchen at all", "cooking")
    own = index.assign(KITCHEN.replace("a table", "the table"), "cooking")  # ratio > 0.85 with KITCHEN
    with dest.transaction() as conn:
        index.save_sqlite(conn)
    dest.close()
    counts = import_into(load(run), tmp_path / "dest.sqlite")
    assert counts["clusters_new"] == 1  # the hall opens a cluster; the kitchen joins the destination's own
    lib = ExperienceLibrary(tmp_path / "dest.sqlite")
    assert sorted(lib.get(i).text for i in lib.linked(own, "pos")) == ["Open the fridge before looking for food."]
    lib.close()


def test_merge_deduplicates_with_the_library_novelty_rule(tmp_path):
    a = ExperienceLibrary(tmp_path / "a.sqlite")
    a.add("Open the fridge before looking for food.", "pos", "example", 1.0)
    a.add("Never go west from the hall: it is a dead end.", "neg", "principle", -0.5)
    a.close()
    b = ExperienceLibrary(tmp_path / "b.sqlite")
    b.add("Open the fridge before looking for the food.", "pos", "example", 2.0)  # near duplicate: "the"
    b.add("Read the cookbook first to learn the recipe.", "pos", "pattern", 0.5)
    b.add("Never go west from the hall: it is a dead end.", "pos", "principle", 0.1)  # other zone: not a dup
    b.close()
    la, lb = read_library(tmp_path / "a.sqlite"), read_library(tmp_path / "b.sqlite")
    la.provenance, lb.provenance = {"run": "a"}, {"run": "b"}
    for e in la.entries:
        e["provenance"] = {**e["provenance"], "run": "a"}
    for e in lb.entries:
        e["provenance"] = {**e["provenance"], "run": "b"}
    counts, merged = merge([la, lb], tmp_path / "m.sqlite")
    assert counts[0]["added"] == 2 and (counts[1]["added"], counts[1]["duplicate"]) == (2, 1)
    assert len(merged.entries) == 4  # 2 + 3 - 1 duplicate
    fridge = [e for e in merged.entries if "fridge" in e["text"]]
    assert len(fridge) == 1
    # the existing entry keeps its text and provenance, takes the higher score (max(1.0, 2.0)) and records the
    # duplicate's provenance
    assert fridge[0]["text"] == "Open the fridge before looking for food." and fridge[0]["score"] == 2.0
    assert fridge[0]["provenance"]["run"] == "a" and [m["run"] for m in fridge[0]["merged"]] == ["b"]
    assert sorted(e["zone"] for e in merged.entries if "west" in e["text"]) == ["neg", "pos"]
    with pytest.raises(PortableError, match="exists"):
        merge([la, lb], tmp_path / "m.sqlite")
    # to JSONL: the same entries, through a temporary SQLite file
    _, as_jsonl = merge([la, lb], tmp_path / "m.jsonl")
    assert sorted(map(_key, read_jsonl(tmp_path / "m.jsonl").entries)) == sorted(map(_key, as_jsonl.entries))
    assert read_jsonl(tmp_path / "m.jsonl").provenance["run"] == "merge of a, b"


def test_diff_by_zone_and_level_on_a_hand_case(tmp_path):
    a = ExperienceLibrary(tmp_path / "a.sqlite")
    a.add("Open the fridge before looking for food.", "pos", "example", 1.0)
    a.add("Never go west from the hall: it is a dead end.", "neg", "principle", -0.5)
    a.add("Take the key before you go upstairs to the attic.", "pos", "pattern", 0.5)
    a.close()
    b = ExperienceLibrary(tmp_path / "b.sqlite")
    b.add("Open the fridge before looking for food.", "pos", "example", 1.0)  # the same
    b.add("Never go west from the hall: it is a dead end!", "neg", "principle", -0.25)  # score and text
    b.add("Read the cookbook first to learn the recipe.", "pos", "pattern", 0.5)  # new; the key one is gone
    b.close()
    d = diff(read_library(tmp_path / "a.sqlite"), read_library(tmp_path / "b.sqlite"))
    c = d.counts()
    assert c[("pos", "example")] == {"added": 0, "removed": 0, "changed": 0, "same": 1}
    assert c[("neg", "principle")] == {"added": 0, "removed": 0, "changed": 1, "same": 0}
    assert c[("pos", "pattern")] == {"added": 1, "removed": 1, "changed": 0, "same": 0}
    assert sum(v[k] for v in c.values() for k in ("added", "removed", "changed", "same")) == 4
    changed = next(x for x in d.changes if x.kind == "changed")
    assert changed.fields == ["text", "score"] and (changed.a["score"], changed.b["score"]) == (-0.5, -0.25)
    assert [x.a["text"] for x in d.changes if x.kind == "removed"] == [
        "Take the key before you go upstairs to the attic."]


def test_bad_files_are_portable_errors_and_bad_lines_are_counted(tmp_path):
    with pytest.raises(PortableError, match="no such file"):
        load(tmp_path / "missing.jsonl")
    (tmp_path / "junk.sqlite").write_text("not a database")
    with pytest.raises(PortableError, match="not an experience library"):
        load(tmp_path / "junk.sqlite")
    (tmp_path / "other.jsonl").write_text(json.dumps({"kind": "header", "format": "something-else"}) + "\n")
    with pytest.raises(PortableError, match="not a slea library export"):
        load(tmp_path / "other.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(PortableError, match="no valid entry"):
        load(tmp_path / "empty.jsonl")
    good = {"text": "Take the coin in the cellar.", "zone": "pos", "level": "example", "score": 1.0}
    lines = [json.dumps(good), "not json", json.dumps({**good, "zone": "middle"}),
             json.dumps({**good, "score": "nan"}), json.dumps({"kind": "cluster", "id": 1})]
    (tmp_path / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    lib = load(tmp_path / "mixed.jsonl")  # a plain (header-less) export line is an entry
    assert len(lib.entries) == 1 and lib.malformed == 4
    assert import_into(lib, tmp_path / "x.sqlite")["malformed"] == 4


def test_a_duplicate_merged_into_a_run_library_records_both_provenances(tmp_path):
    run = _run_folder(tmp_path)
    line = {"kind": "entry", "text": "Open the fridge before looking for food.", "zone": "pos", "level": "pattern",
            "score": 3.0, "task_type": "cooking", "provenance": {"run": "other", "model": "tiny", "iteration": 1}}
    (tmp_path / "other.jsonl").write_text(json.dumps(line) + "\n")
    counts = import_into(load(tmp_path / "other.jsonl"), run / "library.sqlite")
    assert counts["duplicate"] == 1 and "added" not in counts
    fridge = next(e for e in load(run).entries if "fridge" in e["text"])
    # learned in run-a (iteration 2, from the run folder), then met again in "other": max score 3.0
    assert fridge["provenance"]["run"] == "run-a" and fridge["provenance"]["iteration"] == 2
    assert fridge["merged"] == [{"run": "other", "model": "tiny", "env": None, "algorithm": None, "iteration": 1}]
    assert fridge["score"] == 3.0


def test_working_copy_of_a_run_folder_is_its_library_whole_and_a_stale_journal_goes(tmp_path):
    run = _run_folder(tmp_path)
    dest = tmp_path / "work" / "library.sqlite"
    dest.parent.mkdir()
    dest.with_name("library.sqlite-wal").write_bytes(b"stale journal")  # never replayed onto the copy
    lib = working_copy(run, dest)
    assert lib.provenance["run"] == "run-a" and len(lib.entries) == 2
    assert not dest.with_name("library.sqlite-wal").exists()

    def dump(path):
        conn = sqlite3.connect(path)
        try:
            return list(conn.iterdump())
        finally:
            conn.close()

    assert dump(dest) == dump(run / "library.sqlite")  # every table, the index and its memo included
