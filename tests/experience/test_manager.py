"""ExperienceManager: gates, evolve metrics and rate limits, usage counts, resume; inspect helpers."""

from __future__ import annotations

import json

from slea.config import ExperienceSection
from slea.experience import inspect as ins
from slea.experience.manager import ExperienceManager, RetrievalResult
from slea.types import Step, Trajectory

KITCHEN = "-= Kitchen =-\nYou are in a kitchen. There is a closed fridge and an apple on the table."
FRIDGE = "You open the fridge. Inside there is some milk."
HALL = "-= Hall =-\nA long hall with a coat rack. Exits lead north and west."


def cfg(**kw) -> ExperienceSection:
    base = {"mode": "step", "warmup_iters": 1, "min_entries": 2, "k_strat": 10, "k_warn": 5, "k_traj": 5}
    base.update(kw)
    return ExperienceSection(**base)


def traj(m: ExperienceManager, tid: int, plan: list[tuple[str, str, float, bool]], *, won: bool,
         used: list[int] | None = None, goal: str = "Drink the milk") -> Trajectory:
    t = Trajectory(group_id=tid // 4, traj_id=tid, goal=goal, task_type="tw", won=won)
    for i, (obs, act, r, ok) in enumerate(plan):
        t.steps.append(Step(t.group_id, tid, i, obs, [1], [2], [0.0], reward=r, done=i == len(plan) - 1,
                            valid=ok, action=act if ok else "", response_text=act, task_type="tw",
                            cluster_id=m.cluster(obs, "tw"), experience_ids=list(used or [])))
    return t


def batch(m: ExperienceManager, used: list[int] | None = None) -> list[Trajectory]:
    return [
        traj(m, 1, [(KITCHEN, "open fridge", 0, True), (FRIDGE, "drink milk", 1.0, True)], won=True, used=used),
        traj(m, 2, [(KITCHEN, "dance", -0.1, False), (KITCHEN, "go east", 0, True), (HALL, "go north", 0, True),
                    (HALL, "go north", 0, True), (HALL, "go north", 0, True)], won=False, used=used),
        traj(m, 3, [(KITCHEN, "eat apple", 0, True)], won=False),
    ]


def test_gates_warmup_min_entries_and_mode_off(tmp_path):
    m = ExperienceManager(cfg(warmup_iters=2, min_entries=3), tmp_path / "lib.sqlite")
    r = m.retrieve(KITCHEN, task_type="tw", iteration=5)
    assert isinstance(r, RetrievalResult) and r.text == "" and r.entry_ids == []  # empty library
    assert r.cluster_id == m.cluster(KITCHEN, "tw") >= 0  # the cluster is given even when gated
    met = m.evolve(batch(m), 0)
    # by hand: R = 1.0, -0.1, 0.0 -> η = median = 0; T+ = {1}, T− = {2, 3}; warnings scored z = −R.
    # Traj 1 (open fridge, drink milk: won) -> 2 principles (open before use; the verbs), the plan, the
    # rewarded move. Traj 2 (z = 0.1) -> 'go north' ×3 repeated, the made-up 'dance', the last move lost;
    # traj 3 (z = 0.0) -> its last move lost: the same words as traj 2's but another command ('eat <object>', not
    # 'go <direction>'), so a lesson of its own, not merged into traj 2's (which would link it to traj 3's cluster).
    got = sorted((e.zone, e.level, e.task_type, round(e.score, 9), sorted(e.sources))
                 for e in m.library.entries())
    assert got == sorted([
        ("pos", "principle", "tw", 1.0, [1]), ("pos", "principle", "tw", 1.0, [1]),
        ("pos", "pattern", "tw", 1.0, [1]), ("pos", "example", "tw", 1.0, [1]),
        ("neg", "pattern", "tw", 0.1, [2]), ("neg", "example", "tw", 0.1, [2]),
        ("neg", "example", "tw", 0.1, [2]), ("neg", "example", "tw", 0.0, [3]),
    ])
    assert (met["added"], met["duplicate"], met["candidates"]) == (8, 0, 8)
    assert len(m.library) == 8 >= m.cfg.min_entries
    assert m.retrieve(KITCHEN, task_type="tw", iteration=1).text == ""  # warm-up
    open_ = m.retrieve(KITCHEN, task_type="tw", iteration=2)
    assert open_.text and open_.entry_ids
    m.close()
    off = ExperienceManager(cfg(mode="off", warmup_iters=0, min_entries=0), tmp_path / "lib.sqlite")
    r = off.retrieve(KITCHEN, task_type="tw", iteration=9)
    assert r.text == "" and r.entry_ids == [] and r.cluster_id >= 0
    off.close()
    few = ExperienceManager(cfg(warmup_iters=0, min_entries=1000), tmp_path / "lib.sqlite")
    assert few.retrieve(KITCHEN, task_type="tw", iteration=9).text == ""  # C_min
    few.close()


def test_fallback_threshold_is_the_config_key(tmp_path):
    """Eq.2 (a cluster with no linked entries) keeps library-wide matches above experience.fallback_threshold."""
    novel = "-= Pantry =-\nA pantry: the kitchen fridge stands open, milk inside, an apple on the shelf."
    found = {}
    for thr in (0.0, 1.0):
        m = ExperienceManager(cfg(warmup_iters=0, min_entries=1, fallback_threshold=thr), tmp_path / f"{thr}.sqlite")
        assert m.retriever.fallback_threshold == thr
        m.evolve(batch(m), 0)
        r = m.retrieve(novel, task_type="tw", goal="Drink the milk", iteration=1)
        found[thr] = (r.entry_ids, m.stats["fallbacks"])
        m.close()
    assert found[0.0][0] and found[0.0][1] == 1  # every entry clears a zero threshold
    assert found[1.0] == ([], 0)  # none can exceed a similarity of 1


def test_evolve_metrics_rate_limits_and_links(tmp_path):
    m = ExperienceManager(cfg(k_strat=2, k_warn=1), tmp_path / "lib.sqlite")
    met = m.evolve(batch(m), 0)
    for key in ("added", "replaced", "rejected", "duplicate", "size_pos", "size_neg", "eta", "t_pos", "t_neg",
                "candidates", "clusters", "evolve_s"):
        assert key in met and isinstance(met[key], float)
    assert met["admitted_pos"] == 2 and met["admitted_neg"] == 1
    assert met["candidates"] == 8 and met["rate_limited"] == 8 - 3  # 4 strategies + 4 warnings, 3 admitted
    assert met["size_pos"] == 2 and met["size_neg"] == 1
    for e in m.library.entries():
        assert e.clusters and all(c in m.index for c in e.clusters)
    kitchen, hall = m.cluster(KITCHEN, "tw"), m.cluster(HALL, "tw")
    # strategies z = R(traj 1) = 1.0, first two in admission order: the principles (both from its first step);
    # warnings z = −R: traj 2 (R = −0.1, z = 0.1) goes before traj 3 (z = 0), its pattern before its
    # examples
    got = sorted((e.zone, e.level, round(e.score, 9), e.sources, e.clusters, e.text[:40])
                 for e in m.library.entries())
    assert got == [
        ("neg", "pattern", 0.1, [2], [hall], "Repeating 'go <direction>' (3 times) bro"),
        ("pos", "principle", 1.0, [1], [kitchen], "On this kind of task the work is done by"),
        ("pos", "principle", 1.0, [1], [kitchen], "Open or unlock what is closed before usi"),
    ]
    m.close()


def test_evolve_on_an_empty_or_stepless_batch(tmp_path):
    m = ExperienceManager(cfg(), tmp_path / "lib.sqlite")
    assert m.evolve([], 0)["added"] == 0
    empty = Trajectory(group_id=0, traj_id=9, goal="g", task_type="tw")
    assert m.evolve([empty], 1)["size"] == 0
    assert m.cluster(None) >= 0  # a missing observation is the empty text
    m.close()


def test_usage_and_success_counts(tmp_path):
    m = ExperienceManager(cfg(), tmp_path / "lib.sqlite")
    m.evolve(batch(m), 0)
    ids = [e.id for e in m.library.entries()][:2]
    met = m.evolve(batch(m, used=ids), 3)
    assert met["used_entries"] == 2 * len(ids)  # two trajectories used them
    for eid in ids:
        e = m.library.get(eid)
        assert e.usage == 2 and e.success == 1 and e.last_used_iter == 3
    m.close()


def test_resume_library_and_cluster_index(tmp_path):
    path = tmp_path / "run" / "library.sqlite"
    m = ExperienceManager(cfg(), path)
    m.evolve(batch(m), 0)
    cids = [m.cluster(o, "tw") for o in (KITCHEN, FRIDGE, HALL)]
    texts = sorted(e.text for e in m.library.entries())
    r1 = m.retrieve(KITCHEN, task_type="tw", iteration=2)
    m.close()
    m2 = ExperienceManager(cfg(), path)
    assert sorted(e.text for e in m2.library.entries()) == texts
    assert [m2.cluster(o, "tw") for o in (KITCHEN, FRIDGE, HALL)] == cids
    assert m2.retrieve(KITCHEN, task_type="tw", iteration=2) == r1
    new = m2.cluster("A brand new observation about a garden shed.", "tw")
    assert new not in cids
    m2.close()


def test_llm_extractor_path(tmp_path):
    calls = []

    def gen(prompts):
        calls.append(len(prompts))
        return [("1. principle: Open containers before looking for food in them.\n"
                 "2. example: In the kitchen, open the fridge first.")] + ["garbage ###"] * (len(prompts) - 1)

    m = ExperienceManager(cfg(extractor="llm"), tmp_path / "lib.sqlite", generate_text=gen)
    met = m.evolve(batch(m), 0)
    assert calls == [3] and met["extract_fallback"] == 2
    texts = [e.text for e in m.library.entries("pos")]
    assert "Open containers before looking for food in them." in texts
    m.close()


def test_inspect_helpers(tmp_path):
    path = tmp_path / "library.sqlite"
    m = ExperienceManager(cfg(warmup_iters=100), path)
    m.evolve(batch(m), 0)
    m.close()
    rows = ins.list_entries(path, limit=3)
    assert len(rows) == 3 and rows[0]["score"] >= rows[-1]["score"]
    for key in ("id", "zone", "level", "score", "usage", "success", "clusters", "text"):
        assert key in rows[0]
    assert all(r["zone"] == "neg" for r in ins.list_entries(path, zone="neg"))
    res = ins.search(path, KITCHEN, task_type="tw")  # ignores the warm-up gate
    assert res.cluster_id >= 0 and res.entry_ids and res.text
    assert ins.search(path, "A never seen observation text here.", task_type="tw").cluster_id == -1
    out = tmp_path / "lib.jsonl"
    n = ins.export_jsonl(path, out)
    assert n == len(out.read_text().splitlines()) and json.loads(out.read_text().splitlines()[0])["text"]
    fresh = tmp_path / "fresh.sqlite"
    counts = ins.import_jsonl(fresh, out)
    assert counts["added"] == n
    assert len(ins.list_entries(fresh, limit=1000)) == n
