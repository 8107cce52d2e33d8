"""Policy loading: LoRA on all or only the top decoder layers (model.lora_layers)."""

from __future__ import annotations

import pytest

from slea.config import ConfigError, ModelSection
from slea.policy.model import load_policy, lora_layer_indices


def test_lora_layer_indices():
    assert lora_layer_indices(None, 30) is None
    assert lora_layer_indices(15, 30) == list(range(15, 30))
    assert lora_layer_indices(30, 30) == list(range(30))
    assert lora_layer_indices([3, 1, 3], 4) == [1, 3]
    for bad in (0, 31, [30], [-1], []):
        with pytest.raises(ConfigError, match="model.lora_layers"):
            lora_layer_indices(bad, 30)


def _adapted_layers(model) -> set[int]:
    return {int(n.split(".layers.")[1].split(".")[0]) for n, p in model.named_parameters()
            if p.requires_grad and "lora_" in n}


def test_lora_on_the_top_layers_only():
    everywhere, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32"))
    top, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora_layers=1))
    assert _adapted_layers(everywhere) == {0, 1}  # the tiny model has 2 decoder layers
    assert _adapted_layers(top) == {1}
    assert all("lora_" in n for n, p in top.named_parameters() if p.requires_grad)
    with pytest.raises(ConfigError, match="model.lora_layers"):
        load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora_layers=3))


def test_a_build_without_config_json_is_never_put_in_place(tmp_path):
    from slea.policy.model import _atomic_dir

    final = tmp_path / "models" / "broken"
    with pytest.raises(RuntimeError, match="wrote no config.json"):
        _atomic_dir(final, lambda tmp: (tmp / "tokenizer.json").write_text("{}"))  # what a rank > 0 builds
    assert not final.exists() and list(final.parent.iterdir()) == []
    assert _atomic_dir(final, lambda tmp: (tmp / "config.json").write_text("{}")) == final
