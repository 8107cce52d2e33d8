from pathlib import Path

import pytest

from slea.config import ConfigError, build_config, dump_config, load_config, unused_settings

RUNS = sorted((Path(__file__).resolve().parents[1] / "experiments" / "results").glob("**/runs/*/config.yaml"))


def test_defaults_and_overrides():
    cfg = build_config({}, ["rollout.groups=2", "algorithm.name=rloo", "env.kwargs.num_games=3",
                            "model.lora_targets=[q_proj,v_proj]"])
    assert cfg.rollout.groups == 2 and cfg.algorithm.name == "rloo"
    assert cfg.env.kwargs == {"num_games": 3}
    assert cfg.model.lora_targets == ["q_proj", "v_proj"]
    assert build_config().algorithm.gamma == 0.95


@pytest.mark.parametrize("override, key", [
    ("rollout.groupz=2", "rollout.groupz: unknown key"),
    ("rollout.groups=two", "rollout.groups:"),
    ("rollout.groups=0", "rollout.groups:"),
    ("algorithm.name=nope", "algorithm.name: unknown algorithm 'nope'; known: "),
    ("env.id=slea/Nope-v0", "env.id: unknown env 'slea/Nope-v0'; registered: "),
    ("experience.extractor=nope", "experience.extractor: unknown experience extractor 'nope'"),
    ("plugins=[no_such_module_xyz]", "plugins: cannot import plugin module 'no_such_module_xyz'"),
    ("algorithm.name=no_such_module_xyz:f", "algorithm.name: cannot import plugin module"),
    ("algorithm.policy_loss=nope", "algorithm.policy_loss: unknown"),
    ("rollout.tool_parser=nope", "rollout.tool_parser: unknown tool parser 'nope'; known: hermes, llama3_json"),
    ("model.dtype=float16", "model.dtype:"),
    ("nokey", "nokey: expected key=value"),
])
def test_errors_name_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        build_config({}, [override])
    msg = str(info.value)
    assert key in msg and "\n" not in msg


TYPOS = [
    ("algoritm.name=grpo", "algoritm: unknown key; did you mean algorithm?"),
    ("rollout.gruop_size=2", "rollout.gruop_size: unknown key; did you mean rollout.group_size?"),
    ("algorithm.name=gpro", "algorithm.name: unknown algorithm 'gpro'; did you mean 'grpo'? known: gigpo, grpo"),
    ("algorithm.policy_loss=ppoclip", "algorithm.policy_loss: unknown policy loss 'ppoclip'; did you mean 'ppo_clip'?"),
    ("rollout.tool_parser=hermez",
     "rollout.tool_parser: unknown tool parser 'hermez'; did you mean 'hermes'? known: hermes, llama3_json"),
    ("env.id=slea/TextWorld-v9",
     "env.id: unknown env 'slea/TextWorld-v9'; did you mean 'slea/TextWorld-v0'? registered: slea/ALFWorld-Gen-v0"),
    ("model.generator=opneai",
     "model.generator: Input should be 'hf', 'openai' or 'vllm' (got 'opneai'); did you mean 'openai'?"),
    ("run.loggers=[jsonl,wandbb]",
     "run.loggers.1: Input should be 'jsonl', 'tensorboard', 'wandb' or 'mlflow' (got 'wandbb'); did you mean 'wandb'?"),
]


@pytest.mark.parametrize("override, says", TYPOS)
def test_a_typo_gets_the_closest_valid_key_or_name(override, says):
    with pytest.raises(ConfigError) as info:
        build_config({}, [override])
    assert str(info.value).startswith(says), str(info.value)


@pytest.mark.parametrize("override", ["rollout.zzz=1", "algorithm.name=nope", "env.id=slea/Nope-v0",
                                      "rollout.tool_parser=nope"])
def test_nothing_close_suggests_nothing(override):
    with pytest.raises(ConfigError) as info:
        build_config({}, [override])
    assert "did you mean" not in str(info.value)


def test_rollout_tool_parser_names_a_registered_parser():
    """Checked when the config is built, before any model loads: a built-in or a plugin's parser passes."""
    from slea.policy.tool_calls import TOOL_PARSERS, HermesParser

    assert build_config({}, ["rollout.tool_parser=llama3_json"]).rollout.tool_parser == "llama3_json"
    assert build_config({}).rollout.tool_parser is None  # chosen from the chat template
    TOOL_PARSERS.add("test_mine", HermesParser())
    try:
        assert build_config({}, ["rollout.tool_parser=test_mine"]).rollout.tool_parser == "test_mine"
    finally:
        TOOL_PARSERS.remove("test_mine")
    with pytest.raises(ConfigError, match="unknown tool parser 'test_mine'"):
        build_config({}, ["rollout.tool_parser=test_mine"])


def test_yaml_round_trip(tmp_path):
    cfg = build_config({}, ["train.iterations=3"])
    p = tmp_path / "c.yaml"
    p.write_text(dump_config(cfg))
    assert load_config(p) == cfg


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.clip_eps_high=0.28"], "algorithm.clip_eps_high: not read by policy_loss ppo_clip"),
    (["algorithm.dual_clip_c=5"], "algorithm.dual_clip_c: not read by policy_loss ppo_clip"),
    (["algorithm.step_weight=0.5"], "algorithm.step_weight: not a setting of algorithm grpo"),
    (["algorithm.name=rloo", "algorithm.std_norm=false"], "algorithm.std_norm: not a setting of algorithm rloo"),
    (["algorithm.vf_coef=0.5"], "algorithm.vf_coef: algorithm grpo has no critic"),
    (["train.critic_lr=0.1"], "train.critic_lr: algorithm grpo has no critic"),
    (["algorithm.kl_estimator=k1"], "algorithm.kl_estimator: algorithm.kl_coef is 0"),
    (["algorithm.max_refill_rounds=5"], "algorithm.max_refill_rounds: algorithm.dynamic_sampling is off"),
    (["algorithm.tis_cap=3"], "algorithm.tis_cap: algorithm.old_logprobs is not tis"),
    (["algorithm.options={typo: 1}"], "algorithm.options.typo: not a setting of algorithm grpo"),
    (["algorithm.options={gamma: 1}"], "algorithm.options.gamma: set algorithm.gamma instead"),
])
def test_settings_the_algorithm_does_not_read_are_refused(overrides, key):
    with pytest.raises(ConfigError) as info:
        build_config({}, overrides)
    assert str(info.value).startswith(key) and "\n" not in str(info.value)


def test_settings_the_algorithm_reads_pass():
    build_config({}, ["algorithm.policy_loss=clip_higher", "algorithm.clip_eps_high=0.28"])
    build_config({}, ["algorithm.policy_loss=dual_clip", "algorithm.dual_clip_c=5"])
    build_config({}, ["algorithm.name=gigpo", "algorithm.step_weight=0.5", "algorithm.options={cross_step_stats: true}"])
    build_config({}, ["algorithm.name=ppo", "algorithm.vf_coef=0.5", "train.critic_lr=0.1", "algorithm.gae_lambda=0.9"])
    build_config({}, ["algorithm.kl_coef=0.01", "algorithm.kl_estimator=k1"])
    build_config({}, ["algorithm.old_logprobs=tis", "algorithm.tis_cap=3"])
    build_config({}, ["algorithm.dual_clip_c=3.0"])  # equal to its default: changes nothing, passes
    # compare checks against all its algorithms instead
    assert build_config({}, ["algorithm.step_weight=0.5"], check_unused=False).algorithm.step_weight == 0.5


def test_a_saved_config_loads_back_unchanged(tmp_path):
    cfg = build_config({}, ["algorithm.name=slea", "algorithm.step_weight=0.5"])
    (tmp_path / "c.yaml").write_text(dump_config(cfg))
    assert load_config(tmp_path / "c.yaml") == cfg


def test_every_saved_run_config_loads():
    """The run folders kept in the repository load as resume, eval and agent load them (a saved config lists every
    key, so the unused-settings refusal is off), and none of their algorithm settings is one its algorithm, loss or
    trainer does not read (their team sections hold defaults of their day, which the refusal would name). A
    checkout without the research folders (experiments/results) skips it; the tests below cover the same load on
    configs saved here."""
    if not RUNS:
        pytest.skip("no run folder under experiments/results in this checkout")
    from slea.algorithms.registry import get_algorithm

    assert len(RUNS) > 100
    for path in RUNS:
        cfg = load_config(path, check_unused=False)
        unread = [k for k in unused_settings(cfg) if k.startswith("algorithm.")]
        if "team" in get_algorithm(cfg.algorithm.name).needs and cfg.algorithm.old_logprobs == "rollout":
            # a team run saved before a team's auto resolved to recompute: it recorded the single-agent CPU
            # resolution (rollout), which the team trainer never read (it always recomputes)
            unread.remove("algorithm.old_logprobs")
        assert unread == [], path


def test_algorithm_defaults_fill_only_what_the_user_left_unset():
    assert build_config({}, ["algorithm.name=slea"]).experience.mode == "step"
    assert build_config({}, ["algorithm.name=slea", "experience.mode=off"]).experience.mode == "off"
    assert build_config({}, ["algorithm.name=gigpo"]).experience.mode == "off"


def test_team_section():
    cfg = build_config({}, ["algorithm.name=teamtr", "team.trust_region.delta=0.02", "team.router=round-robin"])
    assert cfg.team.task == "textworld_planner_actor" and cfg.team.trust_region.delta == 0.02
    assert cfg.algorithm.policy_loss == "teamtr" and cfg.algorithm.clip_eps == 0.1  # the algorithm's defaults
    assert build_config({}, ["algorithm.name=teamtr", "algorithm.clip_eps=0.2"]).algorithm.clip_eps == 0.2
    for override, message in [
        ("team.router=nope", "team.router: unknown router 'nope'; known: retry_invalid, round_robin"),
        ("team.task=nope", "team.task: unknown team task 'nope'; known: ballot_volunteer, searchqa_proposer_critic"),
        ("team.trust_region.min_steps=9", "team.trust_region.min_steps: must be <= max_steps"),
        ("team.trust_region.delta=0", "team.trust_region.delta:"),
        ("team.order=sorted", "team.order:"),
        ("team.rollouts=old", "team.rollouts:"),
        ("team.iw_clip=1", "team.iw_clip:"),
        ("algorithm.entropy_coef=0.01", "algorithm.entropy_coef: algorithm teamtr's update takes no entropy bonus"),
    ]:
        with pytest.raises(ConfigError) as info:
            build_config({}, ["algorithm.name=teamtr", override])
        assert str(info.value).startswith(message), str(info.value)
    # an algorithm that trains no team reads no team setting: a changed one is refused
    with pytest.raises(ConfigError, match="team.max_turns: algorithm grpo trains no team"):
        build_config({}, ["team.max_turns=3"])
    with pytest.raises(ConfigError, match="team.trust_region.delta: algorithm grpo trains no team"):
        build_config({}, ["team.trust_region.delta=0.02"])
    build_config({}, ["team.max_turns=8"])  # the default value passes (a saved config.yaml lists every key)


PRESETS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_saved_as_a_run_folder_saves_it_loads_back(preset, tmp_path):
    """What a run folder of each shipped preset holds (every key, as the trainer writes it) loads back unchanged
    with the unused-settings refusal off, as resume, eval and agent load it, and names no algorithm setting its
    algorithm, loss or trainer does not read."""
    cfg = load_config(preset)
    (tmp_path / "config.yaml").write_text(dump_config(cfg))
    saved = load_config(tmp_path / "config.yaml", check_unused=False)
    assert saved == cfg
    assert [k for k in unused_settings(saved) if k.startswith("algorithm.")] == []


def test_a_trained_run_folder_s_config_loads_back(tiny_run):
    """The config.yaml a real (tiny) training wrote is the config it trained with."""
    from slea.testing.tiny_run import tiny_slea_config

    saved = load_config(tiny_run / "config.yaml", check_unused=False)
    assert saved == tiny_slea_config(tiny_run)
    assert [k for k in unused_settings(saved) if k.startswith("algorithm.")] == []


@pytest.mark.parametrize("override, line", [
    ("train.learning_rate=1e-5", "train.learning_rate: unknown key; did you mean train.lr? (TRL's learning_rate)"),
    ("learning_rate=1e-5", "learning_rate: unknown key; did you mean train.lr? (TRL's learning_rate)"),
    ("rollout.num_generations=8", ("rollout.num_generations: unknown key; did you mean rollout.group_size? "
                                  "(TRL's num_generations)")),
    ("actor_rollout_ref.actor.optim.lr=1e-6", ("actor_rollout_ref.actor.optim.lr: unknown key; did you mean "
                                              "train.lr? (verl's actor_rollout_ref.actor.optim.lr)")),
    ("algorithm.kl_loss_coef=0.001", ("algorithm.kl_loss_coef: unknown key; did you mean algorithm.kl_coef? "
                                     "(verl's actor_rollout_ref.actor.kl_loss_coef)")),
    ("rollout.n=8", "rollout.n: unknown key; did you mean rollout.group_size? (verl's actor_rollout_ref.rollout.n)"),
    ("train.beta=0.9", "train.beta: unknown key; did you mean train.betas?"),  # a slip of the keyboard wins
    ("train.optim.lr=1e-6", "train.optim: unknown key"),  # verl's actor or critic rate: no guess
    ("env.path=x", "env.path: unknown key"),
])
def test_a_trl_or_verl_key_is_refused_naming_slea_s(override, line):
    """Before, ``train.learning_rate`` was "unknown key" with no hint; the hint comes from one mapping
    (slea/config/foreign.py), which docs/evaluation.md shows."""
    with pytest.raises(ConfigError) as exc:
        build_config({}, [override])
    assert str(exc.value) == line


def test_the_foreign_key_table_of_the_docs_is_the_mapping_and_every_key_in_it_is_real():
    """docs/evaluation.md's table of TRL and verl config names lists exactly slea/config/foreign.py's mapping; each
    slea key there is a config key, and each foreign name is unknown to slea (else its hint could never show)."""
    import re

    from slea.config.foreign import EQUIVALENTS, FOREIGN_KEYS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text()
    section = doc[doc.index("### Config keys in TRL and verl"):]
    rows = re.findall(r"^\| `([\w.]+)` \| (.*?) \| (.*?) \|$", section, re.MULTILINE)
    names = lambda cell: tuple(re.findall(r"`([\w.]+)`", cell))
    assert {key: (names(trl), names(verl)) for key, trl, verl in rows} == EQUIVALENTS
    assert len(rows) == len(EQUIVALENTS)
    tree = build_config().model_dump()
    for key in EQUIVALENTS:
        section_, _, name = key.partition(".")
        assert name in tree[section_], key
    for name in FOREIGN_KEYS:
        with pytest.raises(ConfigError, match=r"unknown key; did you mean"):
            build_config({}, [f"{name}=1"])
