"""``env.kwargs`` and ``env.eval_kwargs`` checked against the env class's constructor when the config loads
(slea.config.checks.check_env_kwargs): a misspelt keyword or a value of the wrong type is one line naming the key,
exit code 2 from the CLI, before any model loads (it used to surface when the env was built, after the model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slea.config import ConfigError, build_config, load_config

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs/smoke.yaml"  # the tiny model on slea/TextWorld-v0
TEAM = ROOT / "configs/teamtr_smoke.yaml"
TEXTWORLD_KEYWORDS = ("tasks, split, num_games, cache_dir, reward, drop_meta, prepare, game_files, "
                      "goal_in_observation")


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(SMOKE, list(overrides))
    assert "\n" not in str(info.value)
    return str(info.value)


def test_an_unknown_keyword_names_the_key_the_closest_keyword_and_all_of_them():
    assert refusal("env.kwargs.num_gmes=2") == ("env.kwargs.num_gmes: not a keyword of slea/TextWorld-v0 "
                                                f"(TextWorldEnv); did you mean 'num_games'? its keywords: "
                                                f"{TEXTWORLD_KEYWORDS}")
    assert refusal("env.eval_kwargs.colour=red") == ("env.eval_kwargs.colour: not a keyword of slea/TextWorld-v0 "
                                                     f"(TextWorldEnv); its keywords: {TEXTWORLD_KEYWORDS}")


WRONG_TYPES = {
    "env.kwargs.num_games=ten": "env.kwargs.num_games: slea/TextWorld-v0 (TextWorldEnv) takes num_games: int, not "
                                "str (got 'ten')",
    "env.kwargs.num_games=2.5": "env.kwargs.num_games: slea/TextWorld-v0 (TextWorldEnv) takes num_games: int, not "
                                "float (got 2.5)",
    "env.eval_kwargs.drop_meta=1": "env.eval_kwargs.drop_meta: slea/TextWorld-v0 (TextWorldEnv) takes drop_meta: "
                                   "bool, not int (got 1)",
    "env.kwargs.tasks=5": "env.kwargs.tasks: slea/TextWorld-v0 (TextWorldEnv) takes tasks: Sequence[str], not int "
                          "(got 5)",
    "env.kwargs.tasks=[coin_collector:1, 2]": "env.kwargs.tasks: slea/TextWorld-v0 (TextWorldEnv) takes tasks: "
                                              "Sequence[str], not list (got ['coin_collector:1', 2])",
}


@pytest.mark.parametrize("override", sorted(WRONG_TYPES))
def test_a_value_of_the_wrong_type_names_the_key_and_the_annotation(override):
    assert refusal(override) == WRONG_TYPES[override]


def test_values_that_fit_pass_unchanged():
    cfg = load_config(SMOKE, ["env.kwargs.tasks=coin_collector:1", "env.kwargs.num_games=3",
                              "env.kwargs.prepare=lazy", "env.eval_kwargs.drop_meta=false"])
    assert cfg.env.kwargs == {"tasks": "coin_collector:1", "num_games": 3, "prepare": "lazy"}  # as given
    cfg = build_config({}, ["env.id=slea/Sokoban-v0", "env.kwargs.dim=[5, 5]", "env.kwargs.difficulty=1"])
    assert cfg.env.kwargs == {"dim": [5, 5], "difficulty": 1}  # an int is a float
    # YAML has no tuple: a list stands for one (ScienceWorld's episodes: Sequence[tuple[str, int]])
    cfg = build_config({}, ["env.id=slea/ScienceWorld-v0", "env.kwargs.episodes=[[boil, 0]]"])
    assert cfg.env.kwargs == {"episodes": [["boil", 0]]}
    with pytest.raises(ConfigError, match=r"^env.kwargs.episodes: .* not list \(got \[\['boil', 'zero'\]\]\)$"):
        build_config({}, ["env.id=slea/ScienceWorld-v0", "env.kwargs.episodes=[[boil, zero]]"])
    with pytest.raises(ConfigError, match=r"^env.kwargs.dim: slea/Sokoban-v0 \(SokobanEnv\) takes dim: "
                                          r"tuple\[int, int\] \| list\[int\], not str \(got '5x5'\)$"):
        build_config({}, ["env.id=slea/Sokoban-v0", "env.kwargs.dim=5x5"])


def test_a_constructor_that_passes_its_keywords_to_its_base_takes_the_base_s():
    """SearchQAToolsEnv(**kwargs) hands them to SearchQAEnv: its keywords are SearchQAEnv's."""
    base = ["env.id=slea/SearchQA-tools-v0", "rollout.tool_parser=hermes"]
    assert build_config({}, [*base, "env.kwargs.top_k=5"]).env.kwargs == {"top_k": 5}
    with pytest.raises(ConfigError, match=r"^env.kwargs.topk: not a keyword of slea/SearchQA-tools-v0 "
                                          r"\(SearchQAToolsEnv\); did you mean 'top_k'\? its keywords: dataset, "):
        build_config({}, [*base, "env.kwargs.topk=5"])


def test_a_constructor_whose_own_kwargs_take_any_keyword_still_has_its_named_ones_checked():
    """The fault-injecting wrapper passes what it does not name to the env it wraps (**inner_kwargs)."""
    base = ["plugins=[slea.testing.faulty_env]", "env.id=slea/test-Faulty-v0", "env.kwargs.inner=slea/Sokoban-v0"]
    cfg = build_config({}, [*base, "env.kwargs.num_games=4", "env.kwargs.crash_prob=0.5"])
    assert cfg.env.kwargs == {"inner": "slea/Sokoban-v0", "num_games": 4, "crash_prob": 0.5}
    with pytest.raises(ConfigError, match=r"^env.kwargs.crash_prob: slea/test-Faulty-v0 \(FaultyEnv\) takes "
                                          r"crash_prob: float, not str \(got 'high'\)$"):
        build_config({}, [*base, "env.kwargs.crash_prob=high"])


@pytest.fixture
def model_loads(monkeypatch):
    """Every call of slea.policy.model.load_policy, the one loader of the single-agent and the team trainer (which
    imports it when it builds the team), recorded on its way through."""
    import slea.policy.model
    import slea.trainer.rl

    calls = []
    real = slea.policy.model.load_policy

    def recorded(*args, **kwargs):
        calls.append(args[0].name_or_path)
        return real(*args, **kwargs)

    monkeypatch.setattr(slea.policy.model, "load_policy", recorded)
    monkeypatch.setattr(slea.trainer.rl, "load_policy", recorded)
    return calls


@pytest.mark.parametrize("config", [SMOKE, TEAM], ids=["single-agent", "team"])
def test_slea_train_refuses_bad_env_kwargs_before_the_model_loads(config, slea_cli, model_loads, tmp_path):
    run = tmp_path / "run"
    r = slea_cli("train", str(config), "--set", "env.kwargs.num_gmes=2", "--set", f"run.dir={run}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [("config error: env.kwargs.num_gmes: not a keyword of "
                                              "slea/TextWorld-v0 (TextWorldEnv); did you mean 'num_games'? its "
                                              f"keywords: {TEXTWORLD_KEYWORDS}")]
    assert model_loads == [] and not run.exists()
    # the recorder sees a load the trainer does start: a model folder that does not load, with good env kwargs
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')
    r = slea_cli("train", str(config), "--set", f"model.name_or_path={broken}", "--set", f"run.dir={run}")
    assert r.returncode == 2 and "config error: model.name_or_path:" in r.stderr, r.stderr[-2000:]
    assert model_loads == [str(broken)]
