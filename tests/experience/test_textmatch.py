"""The exact-ratio kernel: fast_ratio and matching_count equal the standard library's difflib, on short texts and
on long ones (200+ characters: autojunk's popular elements), through both block searches (cydifflib and the
str.find core search of large popular rectangles)."""

from __future__ import annotations

import difflib
import random

import pytest

from slea.experience import textmatch
from slea.experience.textmatch import PreparedText, _Match, fast_ratio, matching_count

ROOM = ("-= Kitchen =-\nYou are in a kitchen. A normal one. You see a closed fridge and an oven here. On the "
        "counter you make out a knife, a red apple and a cookbook. There is an open door leading north and an "
        "exit to the west. You don't like doors? Why not try going east, that entranceway is unguarded.")
WORDS = ["apple", "door", "north", "key", "3", "17", "the", "a", "closed", "open", "red", "cellar", "é", "Ω"]


def _perturb(rng: random.Random, s: str, edits: int | None = None) -> str:
    words = s.split(" ")
    for _ in range(rng.choice([0, 1, 2, 3, 6]) if edits is None else edits):
        if not words:
            break
        i = rng.randrange(len(words))
        r = rng.random()
        if r < 0.4:
            words[i] = rng.choice(WORDS)
        elif r < 0.7 and words[i]:
            w = words[i]
            j = rng.randrange(len(w))
            words[i] = w[:j] + rng.choice("xyz") + w[j + 1:]
        elif r < 0.85:
            words.insert(i, rng.choice(WORDS))
        else:
            del words[i]
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


def _long_pairs(seed: int, n: int) -> list[tuple[str, str]]:
    """Pairs of 200-1,500 characters: room descriptions glued and edited, random low-vocabulary text, and both
    mixed, so that b has popular elements (autojunk) and blocks often start or end on them."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kind = rng.randrange(3)
        if kind == 0:
            a = " ".join(_perturb(rng, ROOM, 4) for _ in range(rng.randint(1, 5)))
        elif kind == 1:
            a = "".join(rng.choice("ab c\nxyz.é"[: rng.randint(2, 11)]) for _ in range(rng.randint(200, 900)))
        else:
            a = _perturb(rng, ROOM, 2) + "".join(rng.choice("ab c") for _ in range(rng.randint(0, 600)))
        b = _perturb(rng, a, rng.choice([1, 3, 10, 30])) if rng.random() < 0.7 else " ".join(
            rng.choice(WORDS) for _ in range(rng.randint(60, 300)))
        out.append((a, b) if rng.random() < 0.5 else (b, a))
    return out


def _difflib_count(a: str, b: str) -> int:
    return sum(x.size for x in difflib.SequenceMatcher(None, a, b).get_matching_blocks())


def test_fast_ratio_is_bit_identical_to_difflib():
    for a, b in _pairs(1, 400, 320):
        want = difflib.SequenceMatcher(None, a, b).ratio()
        assert fast_ratio(a, b) == want, (a, b)
        assert matching_count(a, PreparedText(b)) == _difflib_count(a, b)


@pytest.mark.parametrize("seed_from", [0, textmatch._SEED_FROM, 10**12])  # str.find cores / the default / C only
def test_kernel_equals_difflib_on_long_autojunk_strings(monkeypatch, seed_from):
    monkeypatch.setattr(textmatch, "_SEED_FROM", seed_from)
    pairs = _long_pairs(2, 120)
    popular = 0
    for a, b in pairs:
        p = PreparedText(b)
        popular += p.popular
        want = difflib.SequenceMatcher(None, a, b)
        assert p.popular == bool(want.bpopular)
        assert matching_count(a, p) == _difflib_count(a, b), (a, b)
        assert fast_ratio(a, p) == want.ratio(), (a, b)
        m = _Match(a, p)  # the first (largest) block itself, not just the total
        assert tuple(m.longest(0, len(a), 0, len(b))) == tuple(want.find_longest_match(0, len(a), 0, len(b)))
    assert popular > len(pairs) // 2  # autojunk was in play for most pairs


def test_race_bounds_hold_at_every_step():
    """total <= difflib's count <= total + pending, after every refined rectangle (what the race relies on)."""
    for a, b in _long_pairs(3, 30) + _pairs(4, 60, 120):
        want = _difflib_count(a, b)
        m = _Match(a, PreparedText(b))
        while m.heap:
            assert m.total <= want <= m.ub(), (a, b)
            m.step()
        assert m.total == want
