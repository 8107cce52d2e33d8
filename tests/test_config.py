import pytest

from slea.config import ConfigError, build_config, dump_config, load_config


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
    ("algorithm.name=nope", "algorithm.name: unknown advantage 'nope'"),
    ("algorithm.policy_loss=nope", "algorithm.policy_loss: unknown"),
    ("model.dtype=float16", "model.dtype:"),
    ("nokey", "nokey: expected key=value"),
])
def test_errors_name_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        build_config({}, [override])
    msg = str(info.value)
    assert key in msg and "\n" not in msg


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
