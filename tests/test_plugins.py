"""Extensions from outside the package: a user's module registers an algorithm, a policy loss, an env and an
experience extractor, and a config runs them (``plugins: [...]`` or ``"module:function"``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slea.config import ConfigError, build_config

PLUGIN_DIR = Path(__file__).parent / "plugins"


@pytest.fixture
def plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    import my_slea_plugin

    return my_slea_plugin


def test_an_unimported_plugin_is_unknown_and_a_config_imports_it(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    cfg = build_config({"plugins": ["my_slea_plugin"], "algorithm": {"name": "test_plugin_sign"},
                        "env": {"id": "test-plugin/Echo-v0"}})
    assert cfg.algorithm.name == "test_plugin_sign"
    # the module:function form imports the module itself, and its own option is validated
    cfg = build_config({}, ["algorithm.name=my_slea_plugin:sign_advantage", "algorithm.options={scale: 2.0}"])
    assert cfg.algorithm.options == {"scale": 2.0}
    with pytest.raises(ConfigError, match="algorithm.options.scael: not a setting of algorithm test_plugin_sign"):
        build_config({}, ["algorithm.name=my_slea_plugin:sign_advantage", "algorithm.options={scael: 2.0}"])
    with pytest.raises(ConfigError, match="is not registered"):
        build_config({}, ["algorithm.name=my_slea_plugin:CALLS"])


@pytest.mark.slow
def test_plugin_algorithm_loss_env_and_extractor_train_from_a_config(plugin, tmp_path):
    from slea.trainer.rl import Trainer

    plugin.CALLS.update(estimator=0, loss=0, extract=0, advantages=set())
    cfg = build_config({
        "plugins": ["my_slea_plugin"],
        "model": {"name_or_path": "tiny", "dtype": "float32", "lora_r": 4, "lora_alpha": 8,
                  "lora_targets": ["q_proj", "v_proj"]},
        "env": {"id": "test-plugin/Echo-v0", "max_steps": 3},
        "rollout": {"groups": 2, "group_size": 3, "max_new_tokens": 4},
        "algorithm": {"name": "test_plugin_sign", "policy_loss": "my_slea_plugin:plain_pg",
                      "options": {"scale": 0.5}, "skip_zero_advantage": False},
        "experience": {"mode": "step", "extractor": "test_plugin_lessons", "warmup_iters": 0, "min_entries": 1},
        "train": {"iterations": 2, "micro_batch": 6},
        "eval": {"before": False, "greedy": False, "games": 1, "episodes_per_game": 1},
        "run": {"dir": str(tmp_path / "run")},
    })
    summary = Trainer(cfg).fit()
    assert plugin.CALLS["estimator"] == 2 and plugin.CALLS["loss"] > 0 and plugin.CALLS["extract"] == 2
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["update/trained_samples"] > 0 for r in rows)
    # the plugin estimator's ±scale reached the plugin loss, broadcast to the response tokens
    assert plugin.CALLS["advantages"] <= {-0.5, 0.0, 0.5} and plugin.CALLS["advantages"] & {-0.5, 0.5}
    assert summary["after"]["sampled"]["episodes"] == 1
    assert (tmp_path / "run/config.yaml").read_text().count("my_slea_plugin") >= 2  # resumable: plugins saved


def test_builtin_names_leave_out_what_a_plugin_registered():
    from slea.algorithms.registry import ALGORITHMS

    builtins = ALGORITHMS.builtin_names()
    ALGORITHMS.add("test_builtin_names_probe", object(), owner=test_builtin_names_leave_out_what_a_plugin_registered)
    try:
        assert "test_builtin_names_probe" in ALGORITHMS.names()
        assert ALGORITHMS.builtin_names() == builtins and "grpo" in builtins
    finally:
        ALGORITHMS.remove("test_builtin_names_probe")
