"""The settings that make SLEA-RL run as printed: Eq.2 with the clustering's sequence similarity and a strict
threshold δ, the strict gate |E| > C_min, and the LLM extractor's parse counter and fallback."""

from __future__ import annotations

import difflib
import random

import pytest

from slea.config import ExperienceSection
from slea.experience.eq2 import eq2_sequence
from slea.experience.library import ExperienceLibrary
from slea.experience.llm_extractor import LLMExtractor
from slea.experience.manager import ExperienceManager, gate
from slea.experience.retrieval import Retriever
from slea.types import Step, Trajectory

A20 = "abcdefghijklmnopqrst"  # 20 distinct characters
B20 = "abcdefghijklmnopqXYZ"  # its first 17, then 3 others: M = 17, ratio = 2·17 / 40 = 0.85 exactly


# -- Eq.2 as printed ---------------------------------------------------------------------------------------------
def test_eq2_sequence_hand_cases():
    # "abcd" vs "abce": the block "abc", M = 3, ratio = 6 / 8 = 0.75
    assert eq2_sequence("abcd", [(7, "abce")], 0.7) == [(0.75, 7)]
    assert eq2_sequence("abcd", [(7, "abce")], 0.75) == []  # strict: sim = δ is not > δ
    # exactly δ = 0.85: M = 17 of 20 + 20 characters
    assert 2.0 * 17 / 40 == 0.85
    assert eq2_sequence(A20, [(1, B20)], 0.85) == []
    assert eq2_sequence(A20, [(1, B20)], 0.849) == [(0.85, 1)]
    assert eq2_sequence(A20, [(1, A20)], 0.85) == [(1.0, 1)]
    # a lesson that is a third of the observation (a substring of it) reaches at most 2·100 / 400 = 0.5
    obs = "".join(random.Random(0).choice("abcdefghij klmnop") for _ in range(300))
    assert eq2_sequence(obs, [(3, obs[:100])], 0.85) == []
    assert eq2_sequence(obs, [(3, obs[:100])], 0.49) == [(0.5, 3)]
    # nothing in common: ratio 0, never returned, even at δ = 0
    assert eq2_sequence("aaaa", [(4, "zzzz")], 0.0) == []


def test_eq2_sequence_ranks_best_first_then_lower_id():
    got = eq2_sequence(A20, [(9, B20), (2, A20), (5, B20), (3, "abcdefghijklmnopqrsZ")], 0.8)
    # ratios: A20 1.0; ...rsZ: M = 19 -> 0.95; B20: 0.85 (ids 5 then 9)
    assert got == [(1.0, 2), (0.95, 3), (0.85, 5), (0.85, 9)]


def test_eq2_sequence_equals_difflib_over_random_texts():
    """The bounds only skip what cannot pass: the result is difflib's ratio > δ, every entry checked."""
    rng = random.Random(1)
    alphabet = "abcde fghij"
    for _ in range(60):
        obs = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 260)))
        entries = []
        for eid in range(12):
            if obs and rng.random() < 0.6:  # a perturbed copy: some near δ
                chars = list(obs)
                for _ in range(rng.randint(0, max(1, len(chars) // 4))):
                    chars[rng.randrange(len(chars))] = rng.choice(alphabet)
                text = "".join(chars)[: rng.randint(1, len(chars))]
            else:
                text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 260)))
            entries.append((eid, text))
        delta = rng.choice([0.5, 0.7, 0.85, 0.9])
        want = sorted(((difflib.SequenceMatcher(None, obs, t).ratio(), e) for e, t in entries
                       if difflib.SequenceMatcher(None, obs, t).ratio() > delta), key=lambda x: (-x[0], x[1]))
        assert eq2_sequence(obs, entries, delta) == want


@pytest.fixture
def lib(tmp_path):
    lib = ExperienceLibrary(tmp_path / "lib.sqlite", capacity_pos=50, capacity_neg=50)
    yield lib
    lib.close()


def test_retriever_sequence_mode_uses_the_observation_alone_and_links(lib):
    obs = "You are in the attic. A locked wooden chest stands here."
    near = obs.replace("attic", "attik")  # one letter apart: ratio > 0.85
    close = lib.add(near, "pos", "example", 1.0).entry_id
    words = lib.add("The attic chest is locked: open it with the brass key in the wooden chest room.", "pos",
                    "pattern", 9.0).entry_id  # many shared words, a different sequence
    r = Retriever(lib, top_k_pos=2, top_k_neg=1, fallback_threshold=0.85, similarity="sequence")
    assert difflib.SequenceMatcher(None, obs, lib.get(close).text).ratio() > 0.85
    assert difflib.SequenceMatcher(None, obs, lib.get(words).text).ratio() <= 0.85
    got = r.retrieve(obs, 7, goal="open the chest")
    assert got.fallback and got.entry_ids == [close]
    assert lib.linked(7, "pos") == [close]
    # the goal is not part of Eq.2's o_t: a goal identical to an entry does not make it match
    assert r.retrieve("Nothing alike at all.", 8, goal=near).entry_ids == []
    # the token similarity (the default) ranks by shared words instead and finds the other one too
    tok = Retriever(lib, top_k_pos=2, top_k_neg=1, fallback_threshold=0.2)
    assert words in tok.retrieve(obs, 9).entry_ids
    with pytest.raises(ValueError, match="similarity"):
        Retriever(lib, similarity="cosine")


def test_manager_sequence_mode_thresholds_at_delta(tmp_path):
    paper = ExperienceManager(ExperienceSection(mode="step", fallback_similarity="sequence", cluster_threshold=0.9,
                                                fallback_threshold=0.1), tmp_path / "a.sqlite")
    assert paper.retriever.similarity == "sequence" and paper.retriever.fallback_threshold == 0.9
    default = ExperienceManager(ExperienceSection(mode="step"), tmp_path / "b.sqlite")
    assert default.retriever.similarity == "tokens" and default.retriever.fallback_threshold == 0.5
    paper.close()
    default.close()


# -- the gate ----------------------------------------------------------------------------------------------------
def test_gate_at_c_min():
    assert gate(5, 10, warmup_iters=5, min_entries=10) is True  # |E| >= C_min (default)
    assert gate(5, 10, warmup_iters=5, min_entries=10, strict=True) is False  # |E| > C_min (paper)
    assert gate(5, 11, warmup_iters=5, min_entries=10, strict=True) is True
    assert gate(4, 99, warmup_iters=5, min_entries=10, strict=True) is False  # still warming up
    assert gate(0, 0, warmup_iters=0, min_entries=0) is False  # an empty library never opens it
    assert gate(0, 1, warmup_iters=0, min_entries=0, strict=True) is True


@pytest.mark.parametrize("strict", [False, True])
def test_manager_gate_with_exactly_c_min_entries(tmp_path, strict):
    m = ExperienceManager(ExperienceSection(mode="step", warmup_iters=0, min_entries=2, min_entries_strict=strict),
                          tmp_path / "lib.sqlite")
    m.library.add("Open the fridge before looking for the milk.", "pos", "example", 1.0)
    m.library.add("Walking into the lake ends the game at once.", "neg", "example", 0.0)
    assert len(m.library) == 2
    assert m.gate_open(3) is (not strict)
    m.library.add("Read the map in the hall to find the way out.", "pos", "pattern", 1.0)
    assert m.gate_open(3) is True
    m.close()


# -- the LLM extractor: parse counter and fallback ---------------------------------------------------------------
def _traj(tid: int, won: bool) -> Trajectory:
    t = Trajectory(group_id=0, traj_id=tid, goal="Find the coin", task_type="coin", won=won)
    acts = ["go east", "take coin"] if won else ["dance", "go west"]
    for i, a in enumerate(acts):
        t.steps.append(Step(0, tid, i, f"-= Room {i} =-\nYou are in room {i}.", [1], [2], [0.0],
                            reward=1.0 if won and i == 1 else 0.0, done=i == 1, valid=a != "dance",
                            action=a if a != "dance" else "", response_text=a, task_type="coin", cluster_id=i))
    return t


def test_llm_extractor_counts_parsed_answers_and_falls_back_to_rules():
    answers = ["When the goal names an object in view, take it at once before exploring further.",
               "!!!"]  # the second is junk: that trajectory falls back to the rules
    ex = LLMExtractor(lambda prompts: answers[: len(prompts)])
    cands = ex.extract([_traj(1, True)], [_traj(2, False)])
    assert ex.stats["llm_answers"] == 2 and ex.stats["parsed"] == 1 and ex.stats["fallback"] == 1
    assert any(c.zone == "pos" and "take it at once" in c.text for c in cands)
    assert any(c.zone == "neg" for c in cands)  # the rules' warnings for trajectory 2

    def broken(prompts):
        raise RuntimeError("no model")

    ex2 = LLMExtractor(broken)
    cands2 = ex2.extract([_traj(1, True)], [_traj(2, False)])
    assert ex2.stats["generate_errors"] == 1 and ex2.stats["fallback"] == 2 and ex2.stats["parsed"] == 0
    assert {c.zone for c in cands2} == {"pos", "neg"}
