"""Eq.2's token matrix (SLEA-RL Eq.2): the dense rows of frequent tokens give the same entries as the postings
alone and as a plain scan, including a query of frequent tokens only and ties exactly at the threshold; the
compiled kernel (numba) and the numpy form give the same entries and the same floats. Every test here runs
both (``impl``), the kernel only where numba is installed."""

from __future__ import annotations

import random

import numpy as np
import pytest

from slea.experience.eq2 import TokenMatrix, best_per_zone
from slea.experience.library import ExperienceLibrary
from slea.experience.retrieval import Retriever
from slea.testing.retrieval import ScanEq2


@pytest.fixture(params=["kernel", "numpy"])
def impl(request, monkeypatch):
    """Which implementation :meth:`TokenMatrix.above` runs: the numba kernel, or numpy (numba hidden)."""
    from slea.experience import eq2

    if request.param == "kernel" and not eq2._compiled():
        pytest.skip("numba is not installed (the experience extra)")
    if request.param == "numpy":
        monkeypatch.setattr(eq2, "_KERNEL", False)
    return request.param


def _lib(path, texts):
    lib = ExperienceLibrary(path, capacity_pos=10**6, capacity_neg=10**6, novelty_threshold=1.01)
    with lib.transaction():
        for i, (text, task) in enumerate(texts):
            lib.add(text, "pos" if i % 3 else "neg", "example", float(i % 4), task_type=task)
    return lib


def _task(i: int) -> str:
    return f"game{chr(97 + i % 26)}{chr(97 + i // 26)}"


def _ids(m: TokenMatrix, rows: np.ndarray) -> set[int]:
    return set(m.eids[rows].tolist())


def test_a_query_of_only_frequent_tokens_is_scored_by_the_dense_rows_exactly(tmp_path, impl):
    rng = random.Random(3)
    common = ["north", "south", "door", "key", "lamp"]  # each in most entries: dense rows
    rare = ["".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(7)) for _ in range(400)]  # df ~ 3
    texts = [(" ".join(rng.sample(common, rng.randint(1, 5)) + rng.sample(rare, rng.randint(0, 3))),
              rng.choice(["", "coin", "cook"])) for _ in range(800)]
    lib = _lib(tmp_path / "f.sqlite", texts)
    m, plain = TokenMatrix(lib), TokenMatrix(lib, dense_share=0)
    assert set(m.dense_ids) == set(common) and plain.dense.shape[0] == 0  # the dense path is the one tested
    scan = ScanEq2(lib)
    r = Retriever(lib, top_k_pos=3, top_k_neg=2, fallback_threshold=0.4)
    for q in ["north", "north south", "door key lamp", "north south door key lamp", f"lamp {rare[3]} {rare[7]}",
              " ".join(rare[:200] + ["key"])]:
        tokens = tuple(set(q.split()))
        for task in ("", "coin", "cook", "unknown"):
            want = scan.similar(q, task, 0.4)
            rows, sim = m.above(tokens, 0.4, task)
            prow, psim = plain.above(tokens, 0.4, task)
            assert _ids(m, rows) == _ids(plain, prow) == {eid for _, eid in want}
            assert dict(zip(m.eids[rows].tolist(), sim.tolist())) == pytest.approx(
                dict(zip(plain.eids[prow].tolist(), psim.tolist())), rel=1e-12)
            ranked = r.similar(q, task)
            assert {eid for _, eid in ranked} == {eid for _, eid in want}
            top = {"pos": 2, "neg": 1}  # per zone: its best k and the ties at its k-th similarity, in rank order
            kth = {z: sorted((v for v, eid in ranked if lib.get(eid).zone == z), reverse=True)[k - 1:k]
                   for z, k in top.items()}
            assert r.similar(q, task, per_zone=top) == [
                (v, eid) for v, eid in ranked if v >= (kth[lib.get(eid).zone] or [0.0])[0]]
    assert m.above(("nothing", "here"), 0.4)[0].size == 0
    lib.close()


def test_a_tie_at_the_threshold_stays_out_through_the_dense_rows(tmp_path, impl):
    """Two tokens of the same df have the same idf: one of them in the query is sim 0.5 exactly, not > 0.5."""
    lib = _lib(tmp_path / "t.sqlite", [("north south", _task(i)) for i in range(40)]
               + [("east west", _task(i)) for i in range(10)])  # one task type each: no duplicate
    m = TokenMatrix(lib)
    assert {"north", "south"} <= set(m.dense_ids)
    assert m.above(("north",), 0.5)[0].size == 0 and ScanEq2(lib).similar("north", "", 0.5) == []
    rows, sim = m.above(("north",), 0.49)
    assert rows.size == 40 and np.all(sim == 0.5)
    assert m.above(("north", "south"), 0.5)[0].size == 40
    lib.close()


def test_the_dense_rows_stay_within_their_bounds(tmp_path, monkeypatch, impl):
    from slea.experience import eq2

    words = " ".join(f"zo{chr(97 + k)}" for k in range(12))  # 12 tokens in every entry
    lib = _lib(tmp_path / "b.sqlite", [(words, _task(i)) for i in range(30)])
    assert len(TokenMatrix(lib).dense_ids) == 12
    monkeypatch.setattr(eq2, "DENSE_MAX_ROWS", 5)
    m = TokenMatrix(lib)
    assert m.dense.shape == (5, 30) and len(m.token_ids) - len(m.dense_ids) == 7
    half = tuple(words.split()[:6])  # 6 of the 12 tokens, some through the dense rows, some through postings
    scan = ScanEq2(lib)
    for threshold in (0.4, 0.5):
        assert _ids(m, m.above(half, threshold)[0]) == {eid for _, eid in scan.similar(" ".join(half), "", threshold)}
    assert m.above(half, 0.4)[0].size == 30
    monkeypatch.setattr(eq2, "DENSE_MAX_BYTES", 8 * 30 * 2)
    assert TokenMatrix(lib).dense.shape == (2, 30)
    lib.close()


def test_best_per_zone_keeps_the_ties_at_the_kth_similarity():
    cand = np.arange(6)
    sim = np.array([0.9, 0.7, 0.7, 0.6, 0.8, 0.8])
    zone = np.array([0, 0, 0, 0, 1, 1], dtype=np.int8)
    rows, s = best_per_zone(cand, sim, zone, {"pos": 2, "neg": 1})
    assert rows.tolist() == [0, 1, 2, 4, 5] and s.tolist() == [0.9, 0.7, 0.7, 0.8, 0.8]
    assert best_per_zone(cand, sim, zone, {"pos": 1})[0].tolist() == [0]
    assert best_per_zone(cand, sim, zone, {"pos": 9, "neg": 9})[0].tolist() == cand.tolist()


def _reference(lib, m: TokenMatrix, q: str, task: str, threshold: float) -> list[tuple[float, int]]:
    """Eq.2 by a plain scan, every sum added term by term in the matrix's token order (token_ids): the same
    floats, bit for bit, that the grouped postings, dense rows and plans must give."""
    from slea.experience.library import content_tokens

    qt = content_tokens(q)
    rank = m.token_ids
    out = []
    for e in lib.entries():
        if e.task_type and task and e.task_type != task:
            continue
        bag = sorted(lib.tokens(e.id), key=rank.__getitem__)
        total = 0.0
        for t in bag:
            total += float(m.idf[rank[t]])
        hit = 0.0
        for t in bag:
            if t in qt:
                hit += float(m.idf[rank[t]])
        if hit and hit / total > threshold:
            out.append((hit / total, e.score, e.id))
    return [(s, eid) for s, _, eid in sorted(out, reverse=True)]


@pytest.mark.parametrize("seed", range(4))
def test_the_grouped_postings_give_the_plain_scans_ranking_and_scores_exactly(tmp_path, impl, seed):
    """Random libraries (typed and untyped entries, frequent and rare tokens, dense rows), random queries of
    every task type, an unknown one and none: the same entries, in the same order, with the same floats."""
    rng = random.Random(seed)
    common = ["north", "south", "door", "key", "lamp", "chest", "table"]
    mid = [f"mid{chr(97 + i)}" for i in range(30)]
    rare = ["".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(6)) for _ in range(300)]
    tasks = ["", "coin", "cook", "hunt"][: 2 + seed % 3]
    texts = [(" ".join(rng.sample(common, rng.randint(0, 4)) + rng.sample(mid, rng.randint(0, 4))
                       + rng.sample(rare, rng.randint(1, 3))), rng.choice(tasks)) for _ in range(300 + 200 * seed)]
    lib = _lib(tmp_path / f"g{seed}.sqlite", texts)
    r = Retriever(lib, top_k_pos=2, top_k_neg=1, fallback_threshold=0.3 + 0.1 * (seed % 2))
    m = r._matrix()
    assert m.dense.shape[0] > 0 and len(m.task_codes) == len([t for t in tasks if t])
    df = {}
    for e in lib.entries():
        for t in lib.tokens(e.id):
            df[t] = df.get(t, 0) + 1
    assert {t: int(m.df[k]) for t, k in m.token_ids.items()} == df
    scan = ScanEq2(lib)
    for _ in range(60):
        q = " ".join(rng.sample(common, rng.randint(0, 7)) + rng.sample(mid, rng.randint(0, 12))
                     + rng.sample(rare, rng.randint(0, 40)))
        for task in [*tasks, "unknown"]:
            want = _reference(lib, m, q, task, r.fallback_threshold)
            assert r.similar(q, task) == want
            assert [e for _, e in want] == [e for _, e in scan.similar(q, task, r.fallback_threshold)] or \
                {e for _, e in want} == {e for _, e in scan.similar(q, task, r.fallback_threshold)}
            kth = {z: sorted((v for v, eid in want if lib.get(eid).zone == z), reverse=True)[k - 1:k]
                   for z, k in r.top_k.items()}
            assert r.similar(q, task, per_zone=r.top_k) == [
                (v, eid) for v, eid in want if v >= (kth[lib.get(eid).zone] or [0.0])[0]]
            assert r.similar(q, task) == want  # again: through the memoised plan
    lib.close()


def test_above_prunes_per_zone_as_best_per_zone_does(tmp_path, impl):
    """``above(..., per_zone)`` keeps what :func:`best_per_zone` keeps from the unpruned answer: each zone's
    best k and the ties at its k-th similarity (a frequent-token vocabulary: many ties), nothing from a zone
    with k = 0 or not named."""
    rng = random.Random(7)
    words = ["north", "south", "door", "key", "lamp", "chest"]
    lib = _lib(tmp_path / "z.sqlite", [(" ".join(rng.sample(words, rng.randint(1, 3))), rng.choice(["", "coin"]))
                                       for _ in range(300)])
    m = TokenMatrix(lib)
    for per_zone in [{"pos": 1}, {"pos": 0, "neg": 3}, {"pos": 2, "neg": 1}, {}, {"pos": 500, "neg": 500}]:
        for q in [("north",), ("north", "door"), ("key", "lamp", "chest"), tuple(words)]:
            for task in ("", "coin"):
                rows, sim = m.above(q, 0.3, task)
                want_rows, want_sim = best_per_zone(rows, sim, m.zone, per_zone)
                got_rows, got_sim = m.above(q, 0.3, task, per_zone)
                assert dict(zip(got_rows.tolist(), got_sim.tolist())) == dict(
                    zip(want_rows.tolist(), want_sim.tolist()))
    lib.close()
