"""A team config's settings that the team trainer (slea/trainer/team.py) does not read: a changed one is refused when
the config loads, in one line that names the key, says the team trainer does not read it and, where
slea/trainer/team_settings.py says, what it does instead. What it reads is declared there (READS), so the refusals
are every other setting: the single-agent trainer's loop, prompt and episode settings, and those of the library,
the tool parser, the episode sampler, FSDP... Their defaults, and the single-agent path, pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import slea
from slea.config import ConfigError, build_config, dump_config, load_config, unused_settings
from slea.trainer.team_settings import DOES, READS

ROOT = Path(__file__).resolve().parents[2]
TEAM = ROOT / "configs/teamtr_smoke.yaml"
SINGLE = ROOT / "configs/smoke.yaml"
SAYS = "algorithm teamtr trains a team, whose trainer (trainer/team.py) does not read it"

# each setting, a valid value other than its default, and what the refusal says the team trainer does instead
IGNORED = {
    "train.updates_per_iter": (3, "takes the trust region's optimizer steps instead"),
    "train.gradient_checkpointing": (True, "checkpoints no activations"),
    "run.episode_samples": (0, "writes no episodes.jsonl"),
    "algorithm.old_logprobs": ("rollout", "always recomputes π_old"),
    "rollout.history": (1, "shows the last team.context_messages messages instead"),
    "rollout.history_summary": (True, "summarises no older actions"),
    "rollout.obs_max_chars": (100, "clips each message at team.message_max_chars instead"),
    "rollout.experience_in": ("user", "puts no experiences in its prompts"),
    "env.max_steps": (3, "ends an episode after team.max_turns agent messages instead"),
    "model.init_from": ("runs/earlier", "starts every agent's adapter fresh on the base model"),
    # refused before only by the team trainer's own check (before the model loads), now when the config loads
    "algorithm.kl_coef": (0.1, "penalises the trust region's token KL instead"),
    "algorithm.dynamic_sampling": (True, "replays the stage's tasks and refills none"),
    "experience.mode": ("step", "retrieves no experiences"),
}
# settings no hand-kept list refused on a team run, which it silently ignored: nothing on the team path reads them
# (tool calls are parsed by the single-agent prompt builder, the team's acting agent answers plain commands; the
# library and the episode sampler are the single-agent trainer's; the team trains in one process; teamtr's loss takes
# no loss_agg_mode). Each with a valid value other than its default and what its refusal adds ('' for nothing)
NEWLY_REFUSED = {
    "rollout.tool_parser": ("hermes", ""),
    "experience.cluster_threshold": (0.9, ""),
    "experience.top_k_pos": (3, ""),
    "algorithm.loss_agg": ("seq-mean-token-sum", ""),
    "run.episode_samples_bytes": (1000, "writes no episodes.jsonl"),
    "train.fsdp": (True, "trains its agents in one process"),
}


@pytest.mark.parametrize("key", sorted(IGNORED))
def test_a_team_config_refuses_each_setting_its_trainer_does_not_read(key):
    value, why = IGNORED[key]
    with pytest.raises(ConfigError) as info:
        load_config(TEAM, [f"{key}={value}"])
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith(f"{key}: {SAYS}; it "), line
    assert why in line, line


@pytest.mark.parametrize("key", sorted(NEWLY_REFUSED))
def test_a_setting_no_list_named_is_refused_because_the_team_trainer_does_not_declare_it(key):
    value, why = NEWLY_REFUSED[key]
    parts = key.split(".")
    assert not any(".".join(parts[:n]) in READS for n in range(1, len(parts) + 1))
    with pytest.raises(ConfigError) as info:
        load_config(TEAM, [f"{key}={value}"])
    assert str(info.value) == f"{key}: {SAYS}" + (f"; it {why}" if why else "")


def test_what_the_team_trainer_reads_loads_and_align_is_not_its_to_refuse():
    cfg = load_config(TEAM, ["train.max_bad_updates=1", "env.max_fault_rate=0.5", "eval.games=3",
                             "team.trust_region.beta=0.1", "rollout.top_k=5", "train.rollout_budget=4",
                             "env.step_timeout_s=5", "align.lr=0.001", "algorithm.clip_eps=0.3"])
    assert (cfg.train.max_bad_updates, cfg.env.max_fault_rate, cfg.eval.games) == (1, 0.5, 3)
    assert cfg.align.lr == 0.001 and cfg.algorithm.clip_eps == 0.3  # the loss's own setting (clip_ratio)


def test_tis_is_refused_too_and_recompute_is_what_the_team_trainer_does():
    with pytest.raises(ConfigError, match=r"^algorithm.old_logprobs: algorithm teamtr trains a team"):
        load_config(TEAM, ["algorithm.old_logprobs=tis"])
    assert load_config(TEAM, ["algorithm.old_logprobs=recompute"]).algorithm.old_logprobs == "recompute"
    assert DOES == {"algorithm.old_logprobs": "recompute"}


def test_a_team_config_with_the_defaults_loads_and_its_saved_config_loads_back(tmp_path):
    cfg = load_config(TEAM)
    # auto resolves to what the team trainer does, whatever the device and precision (a single-agent fp32 CPU
    # run resolves it to rollout): the saved config records it
    assert cfg.algorithm.old_logprobs == "recompute"
    assert load_config(SINGLE, ["run.device=cpu", "model.dtype=float32"]).algorithm.old_logprobs == "rollout"
    # every setting written with its default value passes (a saved config.yaml lists every key)
    defaults = build_config({}, check_unused=False)
    spelled = [f"{k}={json.dumps(getattr(getattr(defaults, k.split('.')[0]), k.split('.')[1]))}"
               for k in [*IGNORED, *NEWLY_REFUSED] if k != "algorithm.old_logprobs"]
    assert load_config(TEAM, spelled).train == cfg.train
    (tmp_path / "config.yaml").write_text(dump_config(cfg))
    saved = load_config(tmp_path / "config.yaml")  # with the refusal on
    assert saved == cfg and unused_settings(saved) == {}


@pytest.mark.parametrize("key", sorted({*IGNORED, *NEWLY_REFUSED}))
def test_the_single_agent_path_still_takes_each(key):
    value = {**IGNORED, **NEWLY_REFUSED}[key][0]
    cfg = load_config(SINGLE, [f"{key}={value}"])
    section, leaf = key.split(".")
    assert getattr(getattr(cfg, section), leaf) == value
    assert key not in unused_settings(cfg)


def test_nothing_on_the_team_path_names_them():
    """The refusals state a fact about the code: the team trainer's modules read none of these keys (those it
    refuses in check_team_config aside, which it names to refuse). tests/trainer/test_team_settings.py scans what
    they do read."""
    src = Path(slea.__file__).parent
    team_path = [src / "trainer/team.py", src / "trainer/team_checkpoint.py", src / "evaluation/team.py",
                 *sorted((src / "team").glob("*.py"))]
    refused_by_its_check = {"algorithm.kl_coef", "algorithm.dynamic_sampling", "experience.mode"}
    for key in {*IGNORED, *NEWLY_REFUSED} - refused_by_its_check:
        for path in team_path:
            assert key not in path.read_text(), (key, path)


def test_the_cli_refuses_in_one_line_with_exit_code_2(slea_cli, tmp_path):
    run = tmp_path / "run"
    r = slea_cli("train", str(TEAM), "--set", "train.updates_per_iter=3", "--set", f"run.dir={run}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [(f"config error: train.updates_per_iter: {SAYS}; it takes the trust "
                                              "region's optimizer steps instead (team.trust_region.min_steps, "
                                              "max_steps)")]
    assert not run.exists()
