"""experiments/searchqa_tools.py's commands and table on hand-made run folders (no model is loaded, nothing is
trained)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from slea.config import dump_config, load_config
from slea.testing.bench import load_script

S = load_script(Path(__file__).resolve().parents[2] / "experiments" / "searchqa_tools.py")


def _result(wins: list[int], f1: float, invalid: float = 0.0, length: float = 2.0) -> dict:
    em = 100.0 * sum(wins) / len(wins)
    return {
        "games": len(wins),
        "per_game_wins": wins,
        "sampled": {
            "success": em / 100,
            "episodes": float(len(wins)),
            "invalid_rate": invalid,
            "episode_len": length,
        },
        "table": {
            "rows": [{"label": "sampled T=0", "values": {"fanoutqa-single EM": em, "fanoutqa-single F1": f1}}]
        },
    }


def _finished(
    root: Path,
    arm: str,
    seed: int,
    wins: list[int],
    f1: float,
    invalid: float = 0.0,
    sft_wins: list[int] | None = None,
) -> None:
    d = S.run_dir(arm, seed, root)
    (d / "eval").mkdir(parents=True)
    (d / "eval" / "summary.json").write_text(json.dumps({"after": _result(wins, f1, invalid), "wall_s": 1.0}))
    (d / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "train/success": 0.25}) + "\n")
    (d / "timing.json").write_text(json.dumps({"sft_s": 240.0, "grpo_s": 180.0}))
    sft = S.sft_dir(arm, seed, root)
    (sft / "eval").mkdir(parents=True)
    (sft / "eval" / "eval-heldout.json").write_text(json.dumps(_result(sft_wins or [0] * len(wins), 0.0)))


def test_table_pairs_tools_with_tags_by_seed(tmp_path):
    q = 4  # held-out questions
    for seed in range(3):
        # tags answers question 0 on every seed; tools answers questions 0 and 1 on seeds 0 and 1, only 0 on seed 2
        _finished(tmp_path, "tags", seed, [1, 0, 0, 0], 30.0, invalid=0.0)
        _finished(
            tmp_path,
            "tools",
            seed,
            [1, 1, 0, 0] if seed < 2 else [1, 0, 0, 0],
            40.0 + seed,
            invalid=0.25,
            sft_wins=[0, 1, 0, 0],
        )
    (S.run_dir("tools", 3, tmp_path) / "eval").mkdir(parents=True)  # started, not finished: left out
    tab = S.table(tmp_path, seen=[True, False, False, False])  # question 0 is also a training question
    pairs = {p["metric"]: p for p in tab["pairs"]}
    em = pairs["held-out EM"]
    assert (em["a"], em["b"]) == ("tools", "tags") and em["seeds"] == [0, 1, 2]
    assert em["diffs"] == pytest.approx([100 / q, 100 / q, 0.0])
    assert em["p"] == pytest.approx(0.5) and em["p_min"] == 0.25 and em["verdict"] == "not separated"
    assert em["ci_method"] == "seeds, then games" and em["games"] == q
    assert 0.0 <= em["ci"][0] <= em["mean"] <= em["ci"][1]
    assert pairs["held-out F1"]["diffs"] == pytest.approx([10.0, 11.0, 12.0])
    assert pairs["held-out F1"]["p"] == 0.25 and pairs["held-out F1"]["ci_method"] == "seeds"
    assert pairs["held-out invalid-step rate"]["diffs"] == pytest.approx([0.25] * 3)
    assert pairs["held-out EM after SFT only"]["diffs"] == pytest.approx([100 / q] * 3)
    novel = pairs["held-out EM, questions not asked in training"]  # questions 1-3: tags none, tools 1 on s0, s1
    assert novel["diffs"] == pytest.approx([100 / 3, 100 / 3, 0.0]) and novel["games"] == 3
    assert tab["arms"]["tags"]["novel_em"]["mean"] == 0.0 and tab["heldout_seen_in_training"][0] is True
    assert "1 of the 4 held-out questions are also asked in the training split" in (tmp_path / "table.md").read_text()
    assert tab["arms"]["tools"]["seeds"] == [0, 1, 2] and tab["arms"]["tags"]["em"]["mean"] == pytest.approx(
        25.0
    )
    md = (tmp_path / "table.md").read_text()
    assert "| tags | `slea/SearchQA-v0` | 3 | 25.0 ± 0.0 | 30.0 ± 0.0 | s0 1/4, s1 1/4, s2 1/4 |" in md
    assert (
        "| tools | `slea/SearchQA-tools-v0` | 3 | 41.7 ± 14.4 | 41.0 ± 1.0 | s0 2/4, s1 2/4, s2 1/4 |" in md
    )
    assert "| 7.0 ± 0.0 |" in md  # SFT 4 min + GRPO 3 min
    assert (
        "| tools − tags, held-out EM | 3 | s0 +25.00, s1 +25.00, s2 +0.00 | +16.67 ± 14.43 | 0.500 | 0.250 |"
        in md
    )
    assert "3 seeds: the smallest reachable p is 0.250" in md and "needs the 8-seed standard" in md
    assert json.loads((tmp_path / "table.json").read_text())["pairs"] == tab["pairs"]
    # after GRPO − after SFT, per arm, paired by seed and question: tags gains question 0 on every seed (SFT
    # answered none); tools gains question 0 on seeds 0-1, and on seed 2 trades question 1 for question 0
    gains = {g["a"]: g for g in tab["grpo_gains"]}
    assert gains["tags: after GRPO"]["diffs"] == pytest.approx([25.0] * 3)
    # every tags seed's question differences are (+100, 0, 0, 0), so a resample's mean is 100/12 × a Binomial(12,
    # 1/4) count: P(0) = 0.032 > 0.025 and P(≥ 7) = 0.014 < 0.025 ≤ P(≥ 6) = 0.054, so the 95 % interval is [0, 50]
    assert gains["tags: after GRPO"]["ci"] == pytest.approx([0.0, 50.0])
    tools = gains["tools: after GRPO"]
    assert tools["diffs"] == pytest.approx([25.0, 25.0, 0.0]) and tools["p"] == pytest.approx(0.5)
    assert tools["ci_method"] == "seeds, then games" and tools["games"] == q
    # seed 2's per-question differences are +100 and −100: resampling its questions reaches beyond the per-seed
    # differences' range [0, 25], which a seed-only interval never leaves
    assert tools["ci"][0] < 0.0 and tools["ci"][1] > 25.0
    assert "| tools: after GRPO − after SFT | 3 | s0 +25.00, s1 +25.00, s2 +0.00 | +16.67 ± 14.43 | 0.500 |" in md
    assert "train success tags 0.250-0.250, tools 0.250-0.250" in md and "tools 7.0-7.0." in md


def test_the_settings_line_names_the_sft_and_grpo_settings_read_from_the_runs_configs(tmp_path):
    import yaml

    _finished(tmp_path, "tags", 0, [1, 0], 30.0)
    run_config = {
        "env": {"kwargs": {"answerable": "answer"}, "max_steps": 4},
        "rollout": {"max_new_tokens": 64, "groups": 8, "group_size": 4},
        "train": {"iterations": 6},
        "eval": {"games": 2, "episodes_per_game": 1, "temperature": 0},
    }
    (S.run_dir("tags", 0, tmp_path) / "config.yaml").write_text(yaml.safe_dump(run_config))
    (S.sft_dir("tags", 0, tmp_path) / "config.yaml").write_text(
        yaml.safe_dump({"align": {"expert_episodes": 64, "sft_epochs": 6}})
    )
    S.table(tmp_path, seen=[False, False])
    line = next(x for x in (tmp_path / "table.md").read_text().splitlines() if x.startswith("Settings"))
    assert "SFT on the expert's 64 training questions for 6 epochs" in line
    assert "GRPO 6 iterations x 8 groups x 4 episodes" in line and "2 questions x 1 episode, greedy" in line


def test_no_finished_run_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no finished run"):
        S.table(tmp_path)


def _argv(cmd: list[str]) -> list[str]:
    assert cmd[:3] == [sys.executable, "-m", "slea.cli"]
    return cmd[3:]


def _sets(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]


def test_the_arms_run_the_same_pipeline_and_differ_only_in_the_env(tmp_path):
    runs = {
        arm: [(stage, _argv(c)) for stage, c in S.commands(arm, 0, ["train.iterations=1"], tmp_path)]
        for arm in S.ARMS
    }
    for arm, cmds in runs.items():
        (_, sft), (_, grpo) = cmds
        assert [s for s, _ in cmds] == ["sft", "grpo"]
        assert sft[:4] == ["align", str(S.CONFIG), "--method", "sft"] and grpo[:2] == ["train", str(S.CONFIG)]
        assert f"env.id={S.ARMS[arm]}" in _sets(
            sft
        ) and f"model.init_from={S.sft_dir(arm, 0, tmp_path)}" in _sets(grpo)
        assert {*S.COMMON, "train.iterations=1", "run.seed=0"} <= set(_sets(sft)) & set(_sets(grpo))
    strip = ("env.id=", "run.dir=", "model.init_from=")
    same = [[s for s in _sets(c) if not s.startswith(strip)] for arm in S.ARMS for _, c in runs[arm]]
    assert same[0] == same[2] and same[1] == same[3]  # tags' SFT = tools' SFT; tags' GRPO = tools' GRPO


def _saved(d: Path, over: list[str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(
        dump_config(load_config(S.CONFIG, [*over, f"run.dir={d}"], check_unused=False))
    )


def test_started_stages_resume_finished_runs_are_reused_and_other_settings_are_refused(tmp_path):
    over = S.overrides("tools", 1)
    sft, grpo = S.sft_dir("tools", 1, tmp_path), S.run_dir("tools", 1, tmp_path)
    _saved(sft, [*over, "align.method=sft"])
    (stage, cmd), (then, _) = S.commands("tools", 1, root=tmp_path)
    assert (stage, _argv(cmd), then) == ("sft", ["align", "--resume", str(sft)], "grpo")
    # the SFT run is evaluated and has its weights: only GRPO; a started GRPO run resumes
    (sft / "eval").mkdir()
    (sft / "eval" / "eval-heldout.json").write_text("{}")
    (sft / S.SFT_WEIGHTS).parent.mkdir(parents=True)
    (sft / S.SFT_WEIGHTS).write_bytes(b"w")
    _saved(grpo, [*over, f"model.init_from={sft}"])
    assert [_argv(c) for _, c in S.commands("tools", 1, root=tmp_path)] == [["train", "--resume", str(grpo)]]
    with pytest.raises(SystemExit, match="train.iterations"):  # made with other settings
        S.commands("tools", 1, ["train.iterations=2"], tmp_path)
    # a fresh checkout: the evaluated SFT run has no weights, so its SFT stage is trained again first
    (sft / "sft.json").write_text("{}")
    (sft / S.SFT_WEIGHTS).unlink()
    done = []
    S.run("tools", 1, root=tmp_path, execute=lambda cmd, check: done.append(_argv(cmd)))
    assert done == [["align", "--resume", str(sft)], ["train", "--resume", str(grpo)]]
    assert not (sft / "sft.json").exists() and set(json.loads((grpo / "timing.json").read_text())) == {
        "sft_s",
        "grpo_s",
    }
    (grpo / "eval").mkdir()
    (grpo / "eval" / "summary.json").write_text("{}")
    assert S.commands("tools", 1, root=tmp_path) == []


def test_the_pilot_replays_the_first_runs_parse_rule_beside_todays():
    from slea.policy.tool_calls import TOOL_PARSERS

    hermes = TOOL_PARSERS.get("hermes")
    search = '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
    cut = search + '\n<tool_call>\n{"name": "ans'
    assert hermes.parse(cut)[0] and S._first_run_parse(hermes, cut) == ([], "the last tool call is cut off")
    for text in (search, search + '<tool_call>{"name": "a", "arguments": {}}', '<tool_call>{"name": "a"', "x"):
        assert S._first_run_parse(hermes, text) == hermes.parse(text)
    assert set(S.PILOT) == {"first_run", "parse", "parse_stop"} and S.PILOT["first_run"] == (False, False)


def test_mixed_groups_count_the_questions_whose_episodes_disagree():
    assert S.mixed_groups([0, 1, 4, 3, 0, 2], episodes=4) == 3
    assert S.mixed_groups([0] * 16, episodes=4) == 0


def test_the_settings_rule_keeps_todays_settings_unless_another_is_strictly_better():
    def c(mixed, success, invalid):
        return {"mixed_groups": mixed, "success": success, "invalid_rate": invalid}

    same = {"today": c(0, 0.0, 0.45), "t0.7": c(0, 0.0, 0.45), "more_sft": c(0, 0.0, 0.45)}
    assert S.choose(same) == "today"
    assert S.choose({**same, "t0.7": c(0, 0.0, 0.30)}) == "t0.7"  # fewer invalid steps break the tie
    assert S.choose({**same, "t0.7": c(0, 0.0, 0.30), "more_sft": c(0, 0.05, 0.6)}) == "more_sft"
    assert S.choose({**same, "more_sft": c(0, 0.2, 0.1), "more_sft_t0.7": c(2, 0.05, 0.6)}) == "more_sft_t0.7"
    assert next(iter(S.SETTINGS)) == "today" and S.SETTINGS["today"] == ((), 1.0)


def test_held_out_questions_also_asked_in_training_are_found_on_the_real_splits():
    # read off the data by hand: held-out games 9 and 12 are "What is the capital of China?", 10 Russia's, 13 the
    # United States', 14 Pakistan's, all also training questions; game 0 asks when the Great Wall was built
    assert S.seen_in_training(18) == [g in (9, 10, 12, 13, 14) for g in range(18)]


def test_a_pilot_condition_already_measured_is_read_back_not_played_again(tmp_path):
    saved = tmp_path / "cond" / "eval" / "eval-train.json"
    saved.parent.mkdir(parents=True)
    saved.write_text(json.dumps({**_result([0, 2, 4], 0.0, invalid=0.25), "wall_s": 12.34}))
    res = S._play_train(tmp_path / "no-policy", tmp_path / "cond", games=3, episodes=4, temperature=1.0)
    assert res == {"success": 2.0, "invalid_rate": 0.25, "episode_len": 2.0, "episodes": 3.0,
                   "per_game_wins": [0, 2, 4], "wall_s": 12.3}
    assert S.mixed_groups(res["per_game_wins"], episodes=4) == 1


# -- the committed runs: the tables and the page ----------------------------------------------------------------
COMMITTED = Path(__file__).resolve().parents[2] / "experiments" / "results" / "searchqa_tools"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "results" / "searchqa_tools.md"
STUDIES = {"first": COMMITTED, "second": COMMITTED / "second", "third": COMMITTED / "third"}


def _remade(tmp_path: Path, study: str) -> dict:
    """The table command run on a copy of a committed study's run folders (its runs and SFT stages only)."""
    root = tmp_path / study
    for part in ("runs", "sft"):
        shutil.copytree(STUDIES[study] / part, root / part)
    return S.table(root)


@pytest.mark.parametrize("study", list(STUDIES))
def test_the_committed_tables_are_what_the_table_command_makes_of_the_committed_runs(tmp_path, study):
    tab = _remade(tmp_path, study)
    assert (tmp_path / study / "table.md").read_text() == (STUDIES[study] / "table.md").read_text()
    assert tab == json.loads((STUDIES[study] / "table.json").read_text())


def _page(x: float) -> str:
    """A figure as the page writes it: one decimal, signed, a true minus sign, and 0.0 unsigned."""
    r = round(x, 1)
    return "0.0" if r == 0 else f"{r:+.1f}".replace("-", "−")


def test_the_page_quotes_the_third_runs_table_remade_from_the_committed_runs(tmp_path):
    page = " ".join(PAGE.read_text().split())
    tab = _remade(tmp_path, "third")
    em = next(c for c in tab["pairs"] if c["metric"] == "held-out EM")
    assert f"{_page(em['mean'])} ± {em['std']:.1f}" == "−9.3 ± 3.2" and em["p"] == 0.25
    assert f"CI [{_page(em['ci'][0])}, {_page(em['ci'][1])}]" == "CI [−18.5, 0.0]"
    assert "−9.3 ± 3.2 (s0 −11.1, s1 −5.6, s2 −11.1; n = 3, p = 0.25, CI [−18.5, 0.0])" in page
    gains = {g["a"].split(":")[0]: g for g in tab["grpo_gains"]}
    assert all(g["ci_method"] == "seeds, then games" and g["games"] == 18 for g in gains.values())
    tags, tools = gains["tags"], gains["tools"]
    assert (
        f"after GRPO − after SFT {_page(tags['mean'])} ± {tags['std']:.1f} EM points, n = 3, p = 0.25, "
        f"CI [{_page(tags['ci'][0])}, {_page(tags['ci'][1])}]"
    ) in page
    assert (
        f"(s0 {tools['diffs'][0] / (100 / 18):+.0f}, s1 {tools['diffs'][1] / (100 / 18):.0f}, s2 −1: "
        f"{_page(tools['mean'])} ± {tools['std']:.1f}, p = {tools['p']:.1f}, "
        f"CI [{_page(tools['ci'][0])}, {_page(tools['ci'][1])}])"
    ) in page
    assert tags["ci"] == pytest.approx([5.556, 25.926], abs=1e-3)
    assert tools["ci"] == pytest.approx([-9.259, 9.259], abs=1e-3)


def test_the_pages_training_ranges_and_wall_times_are_the_first_runs_metrics(tmp_path):
    page = " ".join(PAGE.read_text().split())
    per_seed = _remade(tmp_path, "first")["arms"]

    def span(arm: str, key: str) -> tuple[float, float]:
        xs = [x for d in per_seed[arm]["per_seed"].values() for x in d[key]]
        return min(xs), max(xs)

    lo, hi = span("tools", "train_invalid_by_iteration")
    assert (round(lo, 2), round(hi, 2)) == (0.35, 0.65)
    assert f"`train/invalid_rate` {lo:.2f}-{hi:.2f} over the 6 iterations of the 3 seeds" in page
    assert f"{100 * lo:.0f}-{100 * hi:.0f} % of the sampled tool steps are invalid in every iteration" in page
    assert f"against 0-{100 * span('tags', 'train_invalid_by_iteration')[1]:.0f} % for the tags" in page
    assert f"Train success stays at 0-{100 * span('tools', 'train_success_by_iteration')[1]:.0f} %" in page
    wall = {arm: sorted(d["wall_s"] / 60 for d in per_seed[arm]["per_seed"].values()) for arm in S.ARMS}
    assert f"a `tags` run took {wall['tags'][0]:.1f}-{wall['tags'][-1]:.1f} min" in page
    assert f"a `tools` run {wall['tools'][0]:.1f}-{wall['tools'][-1]:.1f} min" in page
    assert f"The tools runs took {wall['tools'][0]:.0f}-{wall['tools'][-1]:.0f} min each" in page
