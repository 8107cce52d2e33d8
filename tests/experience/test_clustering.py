"""Observation clustering: difflib-ratio semantics at the threshold, scoping, eviction, persistence, exactness
(the default index against difflib scans, and the bounds its exactness rests on)."""

from __future__ import annotations

import difflib
import random
import sqlite3

import pytest
from rapidfuzz.distance import Indel, LCSseq

from slea.experience import prototypes
from slea.experience.clustering import ObservationIndex, difflib_ratio
from slea.experience.prototypes import _CAP, _K, _histogram
from slea.experience.textmatch import _need
from slea.testing.clustering import ExactScanIndex, low_vocab_stream, missed_joins, rand_index

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
    # LRU before the last assign: charlie, alpha, delta -> charlie (ids[2]) was evicted to make room
    assert ids[2] not in idx and sorted([ids[0], d, again]) == sorted(c for c, *_ in idx.clusters())
    assert [idx.lookup(o) for o in obs] == [ids[0], again, -1, d]  # charlie's text no longer matches anything


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


def test_default_index_equals_plain_difflib_scan_on_perturbed_strings():
    stream = _stream(300)
    ref = ExactScanIndex(0.85, fast=False, bounds=False)  # the plain difflib scan
    want = [ref.assign(o, t) for t, o in stream]
    exact = ObservationIndex(0.85)
    assert exact.exact
    assert [exact.assign(o, t) for t, o in stream] == want
    approx = ObservationIndex(0.85, exact=False)
    got = [approx.assign(o, t) for t, o in stream]
    assert rand_index(want, got) >= 0.99


# 26 words: every text shares most of its characters and words with many others, so many pairs sit near δ —
def test_exact_index_equals_exact_scan_on_low_vocabulary_corpus():
    stream = low_vocab_stream(1000, seed=0)
    ref = ExactScanIndex(0.85)  # every prototype, difflib's ratio (bit-identical kernel), rigorous bounds only
    want = [ref.assign(o, t) for t, o in stream]
    idx = ObservationIndex(0.85)
    got = [idx.assign(o, t) for t, o in stream]
    assert missed_joins(got, want) == 0
    assert got == want  # the same clusters, the same ids (ids count up in both)
    assert len(idx) == len(ref) > 400  # many clusters, most observations joining one
    assert idx.stats["bounded"] < idx.stats["searched"] * len(idx) / 4  # the bounds did prune


def test_exact_index_equals_plain_difflib_scan_on_low_vocabulary_corpus():
    stream = low_vocab_stream(150, seed=1)
    ref = ExactScanIndex(0.85, fast=False, bounds=False)  # SequenceMatcher(None, o, proto).ratio() for every proto
    want = [ref.assign(o, t) for t, o in stream]
    idx = ObservationIndex(0.85)
    assert [idx.assign(o, t) for t, o in stream] == want


def test_approximate_mode_never_joins_below_threshold():
    stream = low_vocab_stream(400, seed=2)
    idx = ObservationIndex(0.85, exact=False)
    for t, o in stream:
        n = len(idx)
        cid = idx.assign(o, t)
        if len(idx) == n and idx.prototype(cid) != o:
            assert difflib_ratio(o, idx.prototype(cid)) >= 0.85


def _random_pairs(seed: int, n: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = [(ROOM, ROOM.replace("closed", "open")), ("", ""), ("", "a"), ("é", "e"), ("abcdefghijklmnopqrst",
                                                                                     "abcdefghijklmnopqXYZ")]
    for _ in range(n):
        alphabet = "ab c.\nxé"[: rng.randint(2, 9)]
        a = "".join(rng.choice(alphabet) for _ in range(rng.choice([rng.randint(0, 60), rng.randint(150, 400)])))
        b = _perturb(rng, a) if a.split() and rng.random() < 0.6 else "".join(
            rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
        pairs.append((a, b))
    return pairs


def test_indel_and_histogram_bound_difflib_on_random_strings():
    """M (difflib's matches, autojunk on from 200 characters) <= LCS <= Σ min of bucketed byte counts."""
    for a, b in _random_pairs(0, 400):
        sm = difflib.SequenceMatcher(None, a, b)
        m = sum(block.size for block in sm.get_matching_blocks())
        lcs = LCSseq.similarity(a, b)
        assert m <= lcs, (a, b)
        assert Indel.normalized_similarity(a, b) >= sm.ratio() - 1e-12
        hist = _histogram(a.encode()).astype(int), _histogram(b.encode()).astype(int)
        assert len(hist[0]) == _K and sum(map(min, *hist)) >= lcs


def test_lcs_cutoff_keeps_every_pair_at_threshold():
    """The index asks rapidfuzz for the LCS with an integer cutoff, the matches the ratio needs, so a pair exactly
    at δ survives (rapidfuzz 3.14's float cutoff on the normalised score, 0.85, drops this first pair)."""
    a, b = "abcdefghijklmnopqrst", "abcdefghijklmnopqXYZ"
    assert difflib_ratio(a, b) == Indel.normalized_similarity(a, b) == 0.85
    for delta in (0.6, 0.85, 0.95):
        for a, b in _random_pairs(1, 200) + [("abcdefghijklmnopqrst", "abcdefghijklmnopqXYZ")]:
            total = len(a) + len(b)
            if total and difflib_ratio(a, b) >= delta:
                need = _need(delta, total)
                assert LCSseq.similarity(a, b, score_cutoff=need) >= need, (a, b, delta)


def test_histogram_saturates_past_its_cap():
    assert (_histogram(b"e" * (_CAP + 1)) == _CAP).all()
    assert _histogram(b"ee").sum() == 2


def test_evicting_a_middle_row_keeps_the_moved_prototype_findable():
    rng = random.Random(3)
    idx = ObservationIndex(0.85, max_clusters=20)
    texts = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(80)) for _ in range(20)]
    ids = [idx.assign(t) for t in texts]
    assert len(set(ids)) == 20
    for c in ids[2:]:
        idx._touch(c)  # ids[0], ids[1] are now the least recently used
    idx.assign("A completely different observation about a kitchen and an oven.")  # evicts ids[0]
    assert ids[0] not in idx
    for t, c in zip(texts[1:], ids[1:]):
        assert idx.lookup(t + "!") == c  # found through the histogram and LCS steps, not the memo


def test_rand_index():
    assert rand_index([1, 1, 2, 2], [5, 5, 7, 7]) == 1.0
    assert rand_index([1, 1, 1, 1], [1, 2, 3, 4]) == 0.0
    assert rand_index([1], [2]) == 1.0


def test_joins_a_pair_that_shares_no_four_characters_in_a_row():
    """Why the exact index bounds every prototype instead of indexing q-grams or words: a pair at ratio 0.857."""
    rng = random.Random(0)
    a = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(120))
    b = "".join(a[i:i + 3] + "#" for i in range(0, 120, 3))
    assert difflib_ratio(b, a) >= 0.85
    assert not {a[i:i + 4] for i in range(len(a) - 3)} & {b[i:i + 4] for i in range(len(b) - 3)}
    idx = ObservationIndex(0.85)
    fillers = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(130)) for _ in range(20)]
    for f in fillers:  # enough prototypes for the histogram step to run
        idx.assign(f)
    c = idx.assign(a)
    assert idx.assign(b) == c


@pytest.mark.parametrize("delta", [0.6, 0.85, 0.95])
def test_length_window_keeps_pairs_exactly_at_its_edge(delta, monkeypatch):
    """A prefix of b joins b's cluster exactly when 2·la/(la + lb) >= δ, the length window's own edge: the
    shortest and the longest such partners are found among many prototypes of other lengths (sorted columns)."""
    monkeypatch.setattr(prototypes, "_TAIL", 64)  # sort small tables too
    monkeypatch.setattr(prototypes, "_GAP", 0)  # and read only the window's slice, never up to the tail
    rng = random.Random(4)
    for lb in (40, 97, 300):
        b = "".join(rng.choice("abcdefghij") for _ in range(lb))
        la = min(k for k in range(lb + 1) if difflib_ratio(b[:k], b) >= delta)
        for query, proto, miss in ((b[:la], b, b[:la - 1]), (b, b[:la], None)):  # query shorter, then longer
            idx = ObservationIndex(delta)
            c = idx.assign(proto)
            for n in range(1, 400):  # other lengths on both sides of the window; merges of the tail
                idx.assign("".join(rng.choice("klmnopqrst") for _ in range(n)))
            assert idx._tables[""].row[c] < idx._tables[""].nsorted  # the prototype sits in the sorted columns
            assert idx.lookup(query) == c
            if miss is not None:  # one character shorter falls below δ
                assert idx.lookup(miss) == -1


def test_index_equals_a_scan_of_the_live_prototypes_through_evictions_and_merges(monkeypatch):
    """With a small max_clusters, columns die (eviction) and the tail is merged again and again; every assign
    still picks what a difflib scan of the live prototypes picks (best ratio >= δ, ties to the oldest)."""
    monkeypatch.setattr(prototypes, "_TAIL", 64)  # sort small tables too
    stream = [(t, o) for t, o in low_vocab_stream(700, seed=5) if t == "a"]
    idx = ObservationIndex(0.85, max_clusters=80)
    for t, o in stream:
        want, best = -1, -1.0
        for cid, _, proto, _ in sorted(idx.clusters()):
            if Indel.normalized_similarity(o, proto) < 0.85 - 1e-9:  # >= difflib's ratio: only a shortcut
                continue
            r = difflib_ratio(o, proto)
            if r >= 0.85 and r > best:
                want, best = cid, r
        if (t, o) not in idx._memo or idx._memo[(t, o)] not in idx:
            assert idx.lookup(o, t) == want, o
        idx.assign(o, t)
    assert idx.stats["evicted"] > 60
    assert idx._tables["a"].nsorted > 64


def test_an_older_tie_wins_over_the_leader_of_the_histogram_order():
    """The younger of two prototypes at the same ratio has the better histogram bound, so it is refined first
    and sets the floor (here its exact ratio: both sit at the fewest matches δ allows); the older one, exactly at
    that floor, must still be raced and win the tie."""
    rng = random.Random(6)
    for _ in range(50):
        q = "".join(rng.choice("abcdefghij") for _ in range(150))
        cut = rng.sample(range(150), 44)  # 22 characters lost each, elsewhere: the two stay apart
        older = "".join("#" if i in cut[:22] else c for i, c in enumerate(q))
        younger = "".join(rng.choice("abcdefghij".replace(c, "")) if i in cut[22:] else c for i, c in enumerate(q))
        if difflib_ratio(q, older) == difflib_ratio(q, younger) == 2 * _need(0.85, 300) / 300:
            break
    else:
        raise AssertionError("no pair at the same ratio")
    idx = ObservationIndex(0.85)
    for _ in range(30):  # fillers in the length window, far below δ: the histogram step runs
        idx.assign("".join(rng.choice("klmnopqrst") for _ in range(150)))
    a, b = idx.assign(older), idx.assign(younger)
    rows, ubs = idx._tables[""].bounded(q, idx._half)
    assert rows[0] == idx._tables[""].row[b] and ubs[0] > ubs[1]  # the younger leads the histogram order
    assert idx.lookup(q) == a < b
