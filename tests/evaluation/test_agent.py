"""``slea agent``'s core: a frozen tiny model on a smoke env, with and without a library, paired by seed."""

from __future__ import annotations

import pytest

from slea.config import load_config
from slea.evaluation.agent import (
    _rounds,
    agent_overrides,
    agent_table,
    difference,
    extraction_summary,
    paired_games,
    per_seed_success,
    run_agent,
)
from slea.evaluation.evaluate import evaluate
from slea.experience.manager import ExperienceManager
from slea.rollout.collector import RolloutCollector
from slea.types import Trajectory

SETTINGS = ["model.name_or_path=tiny", "model.lora=false", "env.id=slea/Sokoban-v0", "env.kwargs={}",
            "env.eval_kwargs={}", "env.max_steps=2", "rollout.max_new_tokens=4", "eval.games=2",
            "eval.episodes_per_game=1", "eval.greedy=false", "experience.mode=step", "experience.warmup_iters=0",
            "experience.min_entries=0"]


def _traj(seed: int, won: bool) -> Trajectory:
    return Trajectory(traj_id=0, group_id=0, seed=seed, won=won)


def _sections(cfg):
    """What run_agent reads of the config: its sections and the experience mode."""
    return {"rollout": cfg.rollout, "env": cfg.env, "eval_cfg": cfg.eval, "experience_mode": cfg.experience.mode}


def test_difference_rounds_and_paired_games_by_hand():
    a = {"success": 0.25, "return": -0.5, "invalid_rate": 0.5, "episode_len": 3.0, "retrieval_hit_rate": 0.0}
    b = {"success": 0.75, "return": 0.25, "invalid_rate": 0.25, "episode_len": 2.0, "retrieval_hit_rate": 0.5}
    # 0.75 - 0.25 = 0.5; 0.25 - (-0.5) = 0.75; 0.25 - 0.5 = -0.25; 2 - 3 = -1; 0.5 - 0 = 0.5
    assert difference(a, b) == {"success": 0.5, "return": 0.75, "invalid_rate": -0.25, "episode_len": -1.0,
                                "retrieval_hit_rate": 0.5}
    # 5 games from seed 10, 2 per round: seeds 10-11, 12-13, 14
    assert _rounds(10, 5, 2) == [(10, 2), (12, 2), (14, 1)]
    without = [_traj(0, False), _traj(0, True), _traj(1, True), _traj(2, False)]
    with_ = [_traj(0, True), _traj(0, True), _traj(1, False), _traj(2, False)]
    assert per_seed_success(without) == {0: 0.5, 1: 1.0, 2: 0.0}
    # seed 0: 0.5 -> 1.0 better; seed 1: 1.0 -> 0.0 worse; seed 2: 0 -> 0 same
    assert paired_games(without, with_) == {"better": 1, "worse": 1, "same": 1}


def test_an_empty_library_changes_nothing_and_the_no_library_side_is_the_plain_evaluation(setup, tmp_path):
    cfg, gen, builder = setup
    with ExperienceManager(cfg.experience, tmp_path / "empty.sqlite") as m:
        res = run_agent(gen, builder, m, {"split": "heldout"}, **_sections(cfg))
    # nothing to retrieve: both conditions play the same episodes (paired streams), so no difference at all;
    # only the library side's steps were clustered, so only it has Eq.5 step groups
    assert res["with"]["sampled"].pop("step_group_size") > 0 == res["without"]["sampled"].pop("step_group_size")
    assert res["with"] == res["without"]
    assert all(v == 0.0 for d in res["difference"].values() for v in d.values())
    assert res["games_by_success"]["sampled"] == {"better": 0, "worse": 0, "same": 2}
    # the no-library condition is exactly `evaluate` on the same games
    plain = evaluate(RolloutCollector(gen, builder, cfg.rollout, cfg.env.max_steps), cfg.env,
                     {"split": "heldout"}, cfg.eval)
    plain["sampled"].pop("temperature")
    plain["sampled"].pop("step_group_size")
    assert res["without"] == {"sampled": plain["sampled"]}  # no greedy episodes: eval.greedy=false


def test_evolve_learns_from_the_episodes_and_the_library_is_then_retrieved(setup, tmp_path):
    cfg, gen, builder = setup
    lib = tmp_path / "lib.sqlite"
    with ExperienceManager(cfg.experience, lib) as m:
        res = run_agent(gen, builder, m, {"split": "heldout"}, **_sections(cfg), evolve=True, batch=1)
    rounds = res["library"]["rounds"]
    assert [r["seeds"] for r in rounds] == [[0, 0], [1, 1]]  # 2 games, 1 per round
    assert res["library"]["before"]["size"] == 0 and res["library"]["after"]["size"] > 0
    assert res["library"]["after"]["size"] == rounds[-1]["size"]
    assert rounds[0]["candidates"] > 0  # the tiny model's invalid answers are lessons (warnings)
    assert res["without"]["sampled"]["retrieval_hit_rate"] == 0.0
    # the evolved library steers the same games: entries are linked to the clusters of their observations
    with ExperienceManager(cfg.experience, lib) as m:
        size = len(m.library)
        again = run_agent(gen, builder, m, {"split": "heldout"}, **_sections(cfg))
        assert len(m.library) == size  # no --evolve: retrieval only
    w, wo = again["with"]["sampled"], again["without"]["sampled"]
    assert w["retrieval_hit_rate"] > 0.0 == wo["retrieval_hit_rate"]
    assert again["difference"]["sampled"]["return"] == pytest.approx(w["return"] - wo["return"])
    assert again["retrieval"]["retrieved"] > 0 and again["library"]["rounds"] == []
    assert again["without"] == res["without"]  # the no-library side does not depend on the library
    table = agent_table(again)  # the CLI's table: 4 metrics of the sampled episodes
    assert table.row_count == 4 and f"library {size} -> {size} entries" in table.caption


def test_overrides_put_the_library_settings_and_games_before_the_user_set():
    over = agent_overrides("tiny", {"capacity_pos": 7, "novelty_threshold": 0.9}, games=3, seed=5)
    assert over == ["model.name_or_path=tiny", "model.lora=false", "experience.warmup_iters=0",
                    "experience.min_entries=0", "experience.capacity_pos=7", "experience.novelty_threshold=0.9",
                    "eval.games=3", "eval.seed=5"]
    assert agent_overrides(None, {})[:1] == ["experience.warmup_iters=0"]  # a run keeps its own model section
    # the overrides are valid config keys (a typo would be a ConfigError here)
    cfg = load_config(None, [*over, "env.id=slea/Sokoban-v0"])
    assert (cfg.experience.capacity_pos, cfg.eval.games, cfg.model.lora) == (7, 3, False)


def test_the_parse_rate_sums_the_rounds_llm_extraction_by_hand():
    rounds = [{"extract_llm_answers": 4.0, "extract_parsed": 3.0, "extract_fallback": 1.0, "size": 5.0},
              {"extract_llm_answers": 6.0, "extract_parsed": 1.0, "extract_fallback": 5.0,
               "extract_generate_errors": 1.0}]
    # (3 + 1) parsed of (4 + 6) answers = 0.4; fallbacks 1 + 5; one failed generator call
    assert extraction_summary(rounds) == {"answers": 10.0, "parsed": 4.0, "parse_rate": 0.4, "fallback": 6.0,
                                          "generate_errors": 1.0}
    assert extraction_summary([{"size": 3.0}])["parse_rate"] is None  # the rules wrote every lesson


def test_a_library_from_another_env_warns_once_with_both_ids(tmp_path, slea_cli):
    """A library built on TextWorld, played on Sokoban: one warning naming both ids, once per process; none when
    the env is one it was built on or when nothing is recorded. `slea agent` prints it on stderr."""
    from slea.evaluation import agent as A

    A._warned_envs.clear()  # "once per process": another test may have said it already
    assert A.library_envs({"env": "slea/TextWorld-v0"}, [{"provenance": {"env": "slea/Recall-v0"}}, {}]) == [
        "slea/Recall-v0", "slea/TextWorld-v0"]
    assert A.library_env_warning([], "slea/Sokoban-v0") is None  # nothing recorded: nothing to say
    assert A.library_env_warning(["slea/Sokoban-v0"], "slea/Sokoban-v0") is None
    line = A.library_env_warning(["slea/TextWorld-v0"], "slea/Sokoban-v0")
    assert line.startswith("warning: the library was built on slea/TextWorld-v0 and is used on slea/Sokoban-v0")
    assert A.library_env_warning(["slea/TextWorld-v0"], "slea/Sokoban-v0") is None  # once

    from slea.experience.library import ExperienceLibrary

    run = tmp_path / "tw"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  id: slea/TextWorld-v0\nexperience:\n  mode: step\n")
    lib = ExperienceLibrary(run / "library.sqlite")
    lib.add("Open the chest before taking the coin.", "pos", "principle", 1.0, sources=[1], clusters=[0])
    lib.close()
    A._warned_envs.clear()
    r = slea_cli("agent", "--model", "tiny", "--library", str(run), "--env", "slea/Recall-v0", "--games", "1",
                 "--episodes", "1", "--set", "env.max_steps=1", "--set", "eval.greedy=false",
                 "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("warning: the library was built on slea/TextWorld-v0 and is used on slea/Recall-v0") == 1
