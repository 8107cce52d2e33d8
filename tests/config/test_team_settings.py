"""The single-agent trainer's own settings on a team config: the team trainer (slea/trainer/team.py) reads none of
them, so a changed one is refused when the config loads (slea.config.checks.TRAINER_SETTINGS), in one line that
names the key and says what the team trainer does instead; their defaults and the single-agent path pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import slea
from slea.config import TRAINER_SETTINGS, ConfigError, build_config, dump_config, load_config, unused_settings

ROOT = Path(__file__).resolve().parents[2]
TEAM = ROOT / "configs/teamtr_smoke.yaml"
SINGLE = ROOT / "configs/smoke.yaml"

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
}


@pytest.mark.parametrize("key", sorted(IGNORED))
def test_a_team_config_refuses_each_setting_its_trainer_does_not_read(key):
    value, why = IGNORED[key]
    with pytest.raises(ConfigError) as info:
        load_config(TEAM, [f"{key}={value}"])
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith(f"{key}: algorithm teamtr trains a team, whose trainer (trainer/team.py) "), line
    assert why in line, line


def test_tis_is_refused_too_and_recompute_is_what_the_team_trainer_does():
    with pytest.raises(ConfigError, match=r"^algorithm.old_logprobs: algorithm teamtr trains a team"):
        load_config(TEAM, ["algorithm.old_logprobs=tis"])
    assert load_config(TEAM, ["algorithm.old_logprobs=recompute"]).algorithm.old_logprobs == "recompute"


def test_a_team_config_with_the_defaults_loads_and_its_saved_config_loads_back(tmp_path):
    cfg = load_config(TEAM)
    # auto resolves to what the team trainer does, whatever the device and precision (a single-agent fp32 CPU
    # run resolves it to rollout): the saved config records it
    assert cfg.algorithm.old_logprobs == "recompute"
    assert load_config(SINGLE, ["run.device=cpu", "model.dtype=float32"]).algorithm.old_logprobs == "rollout"
    # every setting written with its default value passes (a saved config.yaml lists every key)
    defaults = build_config({}, check_unused=False)
    spelled = [f"{k}={json.dumps(getattr(getattr(defaults, k.split('.')[0]), k.split('.')[1]))}" for k in IGNORED]
    assert load_config(TEAM, spelled).train == cfg.train
    (tmp_path / "config.yaml").write_text(dump_config(cfg))
    saved = load_config(tmp_path / "config.yaml")  # with the refusal on
    assert saved == cfg and unused_settings(saved) == {}


@pytest.mark.parametrize("key", sorted(IGNORED))
def test_the_single_agent_path_still_reads_each(key):
    value, _ = IGNORED[key]
    cfg = load_config(SINGLE, [f"{key}={value}"])
    section, leaf = key.split(".")
    assert getattr(getattr(cfg, section), leaf) == value
    assert TRAINER_SETTINGS[key].when(cfg, _spec(cfg))


def _spec(cfg):
    from slea.algorithms.registry import get_algorithm

    return get_algorithm(cfg.algorithm.name)


def test_nothing_on_the_team_path_names_them():
    """The refusals state a fact about the code: the team trainer's modules read none of these keys. One that
    starts reading a key fails here, and its refusal goes (TRAINER_SETTINGS)."""
    src = Path(slea.__file__).parent
    team_path = [src / "trainer/team.py", src / "trainer/team_checkpoint.py", src / "evaluation/team.py",
                 *sorted((src / "team").glob("*.py"))]
    for key in IGNORED:
        for path in team_path:
            assert key not in path.read_text(), (key, path)


def test_the_guards_settings_load_on_a_team_config_as_both_trainers_read_them():
    """``train.max_bad_updates`` and ``env.max_fault_rate`` are the run state's guards (slea/trainer/run_state.py),
    which the team trainer applies too: a team config takes them."""
    cfg = load_config(TEAM, ["train.max_bad_updates=1", "env.max_fault_rate=0.5"])
    assert cfg.train.max_bad_updates == 1 and cfg.env.max_fault_rate == 0.5
    assert TRAINER_SETTINGS["train.max_bad_updates"].when is None and TRAINER_SETTINGS["env.max_fault_rate"].when is None


def test_the_cli_refuses_in_one_line_with_exit_code_2(slea_cli, tmp_path):
    run = tmp_path / "run"
    r = slea_cli("train", str(TEAM), "--set", "train.updates_per_iter=3", "--set", f"run.dir={run}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [("config error: train.updates_per_iter: algorithm teamtr trains a "
                                              "team, whose trainer (trainer/team.py) takes the trust region's "
                                              "optimizer steps instead (team.trust_region.min_steps, max_steps)")]
    assert not run.exists()
