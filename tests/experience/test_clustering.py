"""Observation clustering: difflib-ratio semantics at the threshold, scoping, eviction, persistence, exactness."""

from __future__ import annotations

import difflib
import random
import sqlite3

import pytest

from slea.experience.clustering import ObservationIndex, difflib_ratio
from slea.testing.clustering import ExactScanIndex, rand_index

ROOM = ("-= Kitchen =-\nYou are in a kitchen. A normal one. You see a closed fridge and an oven here. On the "
        "counter you make out a knife, a red apple and a cookbook. There is an open door leading north and an "
        "exit to the west. You don't like doors? Why not try going east, that entranceway is unguarded.")


def _variants(base: str) -> list[str]:
    """base with its first k characters replaced by '#', k = 0..len: difflib ratio falls as k grows."""
    return [("#" * k) + base[k:] for k in range(len(base) + 1)]


def _edge_pair(base: str, delta: float) -> tuple[str, str]:
    """(a variant at ratio >= delta, the next one at ratio < delta), ratios computed by difflib itself."""
    vs = _variants(base)
    rs = [difflib.SequenceMatcher(None, v, base).ratio() for v in vs]
    for k in range(len(vs) - 1):
        if rs[k] >= delta > rs[k + 1]:
            return vs[k], vs[k + 1]
    raise AssertionError("no crossing")


@pytest.mark.parametrize("base", ["You take the red apple from the wooden counter.", ROOM])
@pytest.mark.parametrize("delta", [0.85, 0.6])
def test_threshold_edges_follow_difflib(base, delta):
    above, below = _edge_pair(base, delta)
    assert difflib_ratio(above, base) >= delta > difflib_ratio(below, base)
    for exact in (True, False):
        idx = ObservationIndex(delta, exact=exact)
        c0 = idx.assign(base)
        assert idx.assign(above) == c0
        idx2 = ObservationIndex(delta, exact=exact)
        idx2.assign(base)
        assert idx2.assign(below) != c0


def test_ratio_exactly_at_threshold_joins():
    a, b = "abcdefghijklmnopqrst", "abcdefghijklmnopqXYZ"
    assert difflib_ratio(b, a) == 0.85
    for exact in (True, False):
        idx = ObservationIndex(0.85, exact=exact)
        c = idx.assign(a)
        assert idx.assign(b) == c


def test_most_similar_cluster_wins_and_ties_go_to_the_oldest():
    idx = ObservationIndex(0.5, exact=True)
    p1 = "the quick brown fox jumps over the lazy dog near the river bank"
    p2 = "a slow green turtle walks under the busy bridge by the old mill"
    c1 = idx.assign(p1)
    c2 = idx.assign(p2)
    assert c1 != c2
    q = "the quick brown fox jumps over the lazy cat near the river bank"
    assert difflib_ratio(q, p1) > difflib_ratio(q, p2)
    assert idx.assign(q) == c1
    # two prototypes at the same ratio: the older one
    idx = ObservationIndex(0.65, exact=True)
    x = idx.assign("XXXX mid ZZZZ")
    y = idx.assign("WWWW mid YYYY")
    assert x != y
    q = "XXXX mid YYYY"
    assert difflib_ratio(q, "XXXX mid ZZZZ") == difflib_ratio(q, "WWWW mid YYYY") >= 0.65
    assert idx.assign(q) == x


def test_task_types_are_separate_scopes():
    idx = ObservationIndex(0.85)
    a = idx.assign("You are in the kitchen.", "cooking")
    b = idx.assign("You are in the kitchen.", "coin")
    assert a != b
    assert idx.assign("You are in the kitchen!", "cooking") == a
    assert idx.task_type_of(a) == "cooking" and idx.task_type_of(b) == "coin"


def test_repeats_keep_their_cluster_and_lookup_changes_nothing():
    idx = ObservationIndex(0.85)
    c = idx.assign("You open the fridge. It is empty.")
    n = len(idx)
    assert idx.lookup("something entirely different") == -1
    assert len(idx) == n
    assert idx.lookup("You open the fridge. It is empty!") == c
    assert idx.assign("You open the fridge. It is empty.") == c
    assert idx.size(c) == 1  # distinct members
    assert idx.assign("You open the fridge. It is empty!") == c
    assert idx.size(c) == 2


def test_eviction_is_lru_and_evicted_ids_never_match_again():
    idx = ObservationIndex(0.85, max_clusters=3)
    obs = ["You are in a kitchen with an oven.", "The chest is locked; find a key first.",
           "North of here lies a dusty attic.", "You eat the carrot. Not bad at all!"]
    ids = [idx.assign(o) for o in obs[:3]]
    idx.assign(obs[0])  # touch: alpha is now the most recent, bravo the least
    d = idx.assign(obs[3])
    assert len(idx) == 3
    assert ids[1] not in idx and ids[0] in idx and ids[2] in idx and d in idx
    again = idx.assign(obs[1])  # the evicted prototype opens a new cluster with a fresh id
    assert again not in ids and again != d
    for o in obs:
        assert idx.lookup(o) in idx or idx.lookup(o) == -1
    assert all(c in idx for c in (idx.lookup(o) for o in obs) if c != -1)


def test_sqlite_round_trip_and_incremental_saves(tmp_path):
    path = tmp_path / "idx.sqlite"
    idx = ObservationIndex(0.85, max_clusters=4)
    stream = [f"You see a {c} box on the {s}." for c in ("red", "blue", "green") for s in ("table", "floor")]
    first = [idx.assign(o, "tw") for o in stream]
    conn = sqlite3.connect(path)
    idx.save_sqlite(conn)
    conn.commit()
    more = [idx.assign(f"Completely new observation number {i} about {w}", "tw")
            for i, w in enumerate(["ships", "kings", "cabbages"])]
    idx.save_sqlite(conn)  # deletes the evicted, writes the touched
    conn.commit()
    back = ObservationIndex.load_sqlite(sqlite3.connect(path))
    assert back.threshold == 0.85 and back.max_clusters == 4
    assert sorted(c for c, *_ in back.clusters()) == sorted(c for c, *_ in idx.clusters())
    assert [c for c, *_ in back.clusters()] == [c for c, *_ in idx.clusters()]  # LRU order kept
    for o, c in zip(stream + [f"Completely new observation number {i} about {w}" for i, w in
                              enumerate(["ships", "kings", "cabbages"])], first + more):
        assert back.lookup(o, "tw") == idx.lookup(o, "tw")
    nxt_a = idx.assign("yet another unseen text", "tw")
    nxt_b = back.assign("yet another unseen text", "tw")
    assert nxt_a == nxt_b  # ids continue from the same counter
    state = ObservationIndex.from_state_dict(idx.state_dict())
    assert list(state.clusters()) == list(idx.clusters())


def test_empty_and_whitespace_observations():
    idx = ObservationIndex(0.85)
    a = idx.assign("")
    assert idx.assign("") == a
    b = idx.assign("   ")
    assert isinstance(b, int)
    assert idx.assign("x") != a or difflib_ratio("x", "") >= 0.85


def _perturb(rng: random.Random, s: str) -> str:
    words = s.split()
    for _ in range(rng.choice([0, 1, 1, 2, 3, 6])):
        op = rng.random()
        i = rng.randrange(len(words))
        if op < 0.4:
            words[i] = rng.choice(["apple", "door", "north", "key", "table", "3", "17", "lamp", "chest"])
        elif op < 0.6:
            words.insert(i, rng.choice(["closed", "open", "red", "small"]))
        elif op < 0.8 and len(words) > 3:
            del words[i]
        else:  # a character-level typo
            w = words[i]
            j = rng.randrange(len(w))
            words[i] = w[:j] + rng.choice("xyz") + w[j + 1:]
    return " ".join(words)


def _stream(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    bases = [ROOM, ROOM.replace("Kitchen", "Pantry").replace("knife", "spoon"),
             "You take the red apple from the wooden counter.", "The fridge is closed. You can open it.",
             "You are carrying: a key, a lamp and 3 coins.", "There is an exit to the north and a door to the east."]
    out = []
    for _ in range(n):
        out.append((rng.choice(["a", "b"]), _perturb(rng, rng.choice(bases))))
    return out


def test_fast_index_equals_exact_difflib_scan_on_perturbed_strings():
    stream = _stream(300)
    ref = ExactScanIndex(0.85, fast=False, bounds=False)  # the plain difflib scan
    want = [ref.assign(o, t) for t, o in stream]
    exact = ObservationIndex(0.85, exact=True)
    assert [exact.assign(o, t) for t, o in stream] == want
    fast = ObservationIndex(0.85)
    got = [fast.assign(o, t) for t, o in stream]
    assert rand_index(want, got) >= 0.99


def test_rand_index():
    assert rand_index([1, 1, 2, 2], [5, 5, 7, 7]) == 1.0
    assert rand_index([1, 1, 1, 1], [1, 2, 3, 4]) == 0.0
    assert rand_index([1], [2]) == 1.0
