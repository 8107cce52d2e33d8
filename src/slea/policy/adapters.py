"""LoRA adapters as files, the way weights travel to a generation server.

A folder holds ``adapter_config.json`` (peft's LoraConfig) and ``adapter_model.safetensors`` (the adapter's
tensors under peft's saved names, without the adapter name): the layout vLLM's dynamic LoRA loading
(``POST /v1/load_lora_adapter``) and ``slea serve`` both read. Safetensors only, never pickles.
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def save_adapter(model, folder: str | Path) -> Path:
    """Write ``model``'s active LoRA adapter (a peft model) to ``folder``; return the folder."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    if not hasattr(model, "peft_config"):
        raise ValueError("weight sync: the model has no LoRA adapter (model.lora: false)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = getattr(model, "active_adapter", "default")
    state = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}
    save_file(state, str(folder / WEIGHTS))
    config = model.peft_config[name].to_dict()
    (folder / CONFIG).write_text(json.dumps(_jsonable(config), indent=2))
    return folder


def read_adapter(folder: str | Path):
    """``(LoraConfig, state)`` of an adapter folder written by :func:`save_adapter` (or by peft)."""
    from peft import LoraConfig
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise FileNotFoundError(f"{folder} is not a LoRA adapter folder ({CONFIG} + {WEIGHTS})")
    raw = json.loads((folder / CONFIG).read_text())
    keep = set(LoraConfig.__dataclass_fields__)
    config = LoraConfig(**{k: v for k, v in raw.items() if k in keep and k not in ("peft_type", "task_type")},
                        task_type=raw.get("task_type"))
    return config, load_file(str(folder / WEIGHTS))


def same_shape(a, b) -> bool:
    """Whether two LoraConfigs give adapters of the same shape (one's weights load into the other's)."""
    keys = ("r", "lora_alpha", "target_modules", "layers_to_transform", "use_rslora", "bias")
    norm = [{k: sorted(v) if isinstance(v, (set, list)) else v for k, v in
             ((k, getattr(c, k, None)) for k in keys)} for c in (a, b)]
    return norm[0] == norm[1]


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (set, tuple, list)):
        return [_jsonable(v) for v in (sorted(obj) if isinstance(obj, set) else obj)]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
