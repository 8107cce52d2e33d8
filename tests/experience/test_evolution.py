"""Library evolution once the policy is good: the η tie rule, and the warning score z = −R (hand cases)."""

from __future__ import annotations

import pytest

from slea.config import ExperienceSection
from slea.experience.extraction import extract_candidates, select, split_outcomes, warning_z
from slea.experience.library import ExperienceLibrary
from slea.experience.manager import ExperienceManager
from slea.experience.retrieval import Retriever
from slea.types import Step, Trajectory

ROOM = "-= Attic =-\nYou are in an attic. There is an exit to the north and a coin on the floor."
HALL = "-= Hall =-\nA hall. Exits lead north and south."


def traj(tid: int, ret: float, *, won: bool, invalid: int = 0, cluster: int = 5) -> Trajectory:
    """A trajectory of return ``ret``: ``invalid`` rejected answers (−0.1 each), then one valid move."""
    t = Trajectory(group_id=tid // 4, traj_id=tid, goal="Pick up the coin.", task_type="coin_collector", won=won,
                   truncated=not won)
    for i in range(invalid):
        t.steps.append(Step(0, tid, i, ROOM, [1], [2], [0.0], reward=-0.1, valid=False, response_text="blah",
                            cluster_id=cluster))
    last = ret + 0.1 * invalid
    t.steps.append(Step(0, tid, invalid, ROOM, [1], [2], [0.0], reward=last, done=True,
                        action="take coin" if won else "go north", cluster_id=cluster))
    assert t.episode_return == pytest.approx(ret)
    return t


def test_tie_rule_admits_strategies_when_more_than_half_the_batch_wins(tmp_path):
    # 5 of 8 at the top return: η = median = 1.0 = max, so R > η is empty
    batch = [traj(i, 1.0, won=True) for i in range(5)] + [traj(5, 0.0, won=False), traj(6, -0.1, won=False, invalid=1),
                                                         traj(7, -0.3, won=False, invalid=3)]
    eta, pos, neg = split_outcomes(batch, "median", "strict")
    assert eta == 1.0 and pos == [] and len(neg) == 8  # the paper as printed: nothing to learn strategies from
    eta, pos, neg = split_outcomes(batch)  # default tie="top": those at the top vs the rest
    assert eta == 1.0 and [t.traj_id for t in pos] == [0, 1, 2, 3, 4] and [t.traj_id for t in neg] == [5, 6, 7]
    _, top, bottom = select(batch, k_traj=2)
    assert [t.traj_id for t in top] == [0, 1] and [t.traj_id for t in bottom] == [7, 6]
    # not when every return is equal (no contrast), and not when something beats η anyway
    same = [traj(i, 1.0, won=True) for i in range(4)]
    assert split_outcomes(same)[1] == []
    mixed = [traj(0, 1.0, won=True), traj(1, 0.5, won=True), traj(2, 0.0, won=False)]
    assert [t.traj_id for t in split_outcomes(mixed)[1]] == [0] and len(split_outcomes(mixed)[2]) == 2

    cfg = {"mode": "step", "warmup_iters": 0, "min_entries": 1, "k_strat": 10, "k_warn": 5, "k_traj": 3}
    got = {}
    for tie in ("top", "strict"):
        with ExperienceManager(ExperienceSection(eta_tie=tie, **cfg), tmp_path / f"{tie}.sqlite") as m:
            met = m.evolve(batch, 0)
            got[tie] = (met["t_pos"], met["admitted_pos"], met["admitted_neg"])
    assert got["strict"][:2] == (0.0, 0.0)
    assert got["top"][0] == 5.0 and got["top"][1] > 0 and got["top"][2] > 0
    assert ExperienceSection().eta_tie == "top"


def test_warning_score_ranks_the_clearest_failure_first():
    """z_warn = −R: the worst failure is tried first, kept over a milder one when the level is full, and
    retrieved first; with warning_score="return" (z = R, as printed) the mildest failure would win all three."""
    win = traj(0, 1.0, won=True)
    mild = traj(1, 0.0, won=False)  # ran out of steps, nothing else wrong
    bad = traj(2, -0.4, won=False, invalid=4)  # 4 invalid answers, then out of steps
    worse = traj(3, -0.6, won=False, invalid=6)
    assert warning_z(-0.4) == 0.4 and warning_z(0.0) == 0.0 and warning_z(-0.4, "return") == -0.4

    _, cands, _ = extract_candidates([win, mild, bad], k_traj=2)
    neg = [c for c in cands if c.zone == "neg"]
    assert neg[0].sources == [2] and neg[0].score == pytest.approx(0.4)  # the clearest failure first
    assert [c.score for c in neg] == sorted((c.score for c in neg), reverse=True)
    assert {c.sources[0]: c.score for c in neg}[1] == 0.0

    def admit(lib, cands):
        for c in cands:
            if c.zone == "neg":
                lib.add(c.text, c.zone, c.level, c.score, task_type=c.task_type, context=c.context,
                        sources=c.sources, clusters=c.clusters)

    lib = ExperienceLibrary(None, capacity_neg=1)  # one warning per level: admission must choose
    admit(lib, cands)
    principle = [e for e in lib.entries("neg") if e.level == "principle"]
    assert len(principle) == 1 and principle[0].sources == [2]  # bad's "invalid answers" beat mild's
    _, cands2, _ = extract_candidates([win, worse, mild], k_traj=2)
    admit(lib, cands2)
    principle = [e for e in lib.entries("neg") if e.level == "principle"]
    # the same lesson from a worse failure: novelty merges them and the entry keeps the higher z (the worse one)
    assert principle[0].sources == [2, 3] and principle[0].score == pytest.approx(0.6)

    lib2 = ExperienceLibrary(None, capacity_neg=10)
    admit(lib2, extract_candidates([win, mild, bad], k_traj=2)[1])
    ranked = Retriever(lib2, top_k_neg=3).from_cluster(5, "neg", 3)
    assert lib2.get(ranked[0]).sources == [2]  # retrieval: the clearest failure's warning first

    # the paper's literal z = R: the mild failure's warning outranks the informative one
    lit = ExperienceLibrary(None, capacity_neg=1)
    admit(lit, extract_candidates([win, mild, bad], k_traj=2, warning_score="return")[1])
    kept = {e.level: e.sources for e in lit.entries("neg")}
    assert kept["principle"] == [1]


def test_config_keys_and_their_defaults():
    from pydantic import ValidationError

    x = ExperienceSection()
    assert (x.eta_tie, x.warning_score, x.extractor_model, x.extract_max_new_tokens, x.extract_temperature) == (
        "top", "neg_return", None, 128, 0.0)
    for bad in ({"eta_tie": "median"}, {"warning_score": "abs"}, {"extract_max_new_tokens": 2},
                {"extract_temperature": -1}):
        with pytest.raises(ValidationError):
            ExperienceSection(**bad)
    with pytest.raises(ValueError):
        split_outcomes([], tie="sometimes")
