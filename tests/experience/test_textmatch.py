"""The exact-ratio kernel: fast_ratio and matching_count equal difflib; the LCS and prefix/suffix bounds never
fall below difflib's match count (checked against difflib and an independent dynamic programme)."""

from __future__ import annotations

import difflib
import random

from slea.experience.textmatch import PreparedText, fast_ratio, lcs_length, match_upper_bound, matching_count

ROOM = ("-= Kitchen =-\nYou are in a kitchen. A normal one. You see a closed fridge and an oven here. On the "
        "counter you make out a knife, a red apple and a cookbook. There is an open door leading north and an "
        "exit to the west. You don't like doors? Why not try going east, that entranceway is unguarded.")


def _perturb(rng: random.Random, s: str) -> str:
    words = s.split()
    for _ in range(rng.choice([0, 1, 2, 3, 6])):
        i = rng.randrange(len(words))
        if rng.random() < 0.5:
            words[i] = rng.choice(["apple", "door", "north", "key", "3", "17"])
        else:
            w = words[i]
            j = rng.randrange(len(w))
            words[i] = w[:j] + rng.choice("xyz") + w[j + 1:]
    return " ".join(words)


def _pairs(seed: int, n: int, max_len: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    alphabet = "ab c\nxyz."
    pairs = [(ROOM, ROOM.replace("closed", "open")), (ROOM, ROOM[::-1]), ("", ""), ("", "a"), ("a", "")]
    for _ in range(n):
        n1, n2 = rng.randint(0, max_len), rng.randint(0, max_len)
        a = "".join(rng.choice(alphabet[: rng.randint(1, len(alphabet))]) for _ in range(n1))
        b = "".join(rng.choice(alphabet) for _ in range(n2))
        if rng.random() < 0.5:
            b = _perturb(rng, a) if a.split() else b
        pairs.append((a, b))
    return pairs


def _lcs_dp(a: str, b: str) -> int:
    """Textbook O(len(a)·len(b)) longest common subsequence: the independent reference."""
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def test_fast_ratio_is_bit_identical_to_difflib():
    for a, b in _pairs(1, 400, 320):
        want = difflib.SequenceMatcher(None, a, b).ratio()
        assert fast_ratio(a, b) == want, (a, b)
        m = sum(x.size for x in difflib.SequenceMatcher(None, a, b).get_matching_blocks())
        p = PreparedText(b)
        assert matching_count(a, p) == m
        assert matching_count(a, p, floor=m + 1) == -1 or m + 1 > min(len(a), len(b))
        assert matching_count(a, p, floor=m) == m


def test_lcs_and_prefix_suffix_bounds_are_upper_bounds_of_difflib():
    for a, b in _pairs(2, 150, 120):
        m = sum(x.size for x in difflib.SequenceMatcher(None, a, b).get_matching_blocks())
        lcs = _lcs_dp(a, b)
        assert lcs_length(a, PreparedText(b)) == lcs >= m, (a, b)
        assert match_upper_bound(a, b) >= lcs, (a, b)
    changed = ROOM[:100] + "#" * 50 + ROOM[150:]
    assert lcs_length(changed, PreparedText(ROOM), max_middle=10) is None  # a middle too long to be worth it
    assert lcs_length(changed, PreparedText(ROOM), max_middle=60) == len(ROOM) - 50
