"""LoRA adapters as files, the way weights travel to a generation server.

A folder holds ``adapter_config.json`` (peft's LoraConfig) and ``adapter_model.safetensors`` (the adapter's
tensors under peft's saved names, without the adapter name): the layout vLLM's dynamic LoRA loading
(``POST /v1/load_lora_adapter``) and ``slea serve`` both read. Safetensors only, never pickles. A folder from
elsewhere is checked before anything is applied (:func:`read_lora`: plain LoRA, exactly the LoRA tensors its config
gives the model, finite) and swapped in only once loaded (:func:`swap_lora`).
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


# adapter_config.json fields that shape the LoRA tensors (passed on), and fields that only describe the adapter
# (ignored; init_lora_weights too: every tensor is loaded from the file). Any other field set to other than its
# default (modules_to_save, layer_replication, trainable_token_indices, a non-"none" bias, ...) would touch the base
# model or load more than LoRA tensors: refused.
LORA_FIELDS = ("r", "lora_alpha", "target_modules", "exclude_modules", "layers_to_transform", "layers_pattern",
               "rank_pattern", "alpha_pattern", "use_rslora", "use_dora", "lora_bias", "fan_in_fan_out", "bias",
               "lora_dropout", "task_type", "peft_type")
INFO_FIELDS = ("auto_mapping", "peft_version", "base_model_name_or_path", "revision", "inference_mode",
               "init_lora_weights", "megatron_core", "runtime_config")


class AdapterError(ValueError):
    """An adapter folder that is not a LoRA adapter of the served model (the message names the file)."""


def read_lora(folder: str | Path, model_config) -> tuple:
    """``(LoraConfig, state)`` of an adapter folder, checked against a model of ``model_config`` before anything is
    applied: its config plain LoRA (:data:`LORA_FIELDS`), its tensors exactly the LoRA tensors that config gives
    the model (names and shapes, read from the file's header before its data), floating point and finite. An
    :class:`AdapterError` otherwise."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise FileNotFoundError(f"{folder} is not a LoRA adapter folder ({CONFIG} + {WEIGHTS})")
    config = read_lora_config(folder / CONFIG)
    try:
        layout = lora_layout(model_config, config)
    except Exception as exc:  # noqa: BLE001  (whatever peft raises: the config does not apply to this model)
        raise AdapterError(f"{folder / CONFIG}: peft cannot apply it to this model ({type(exc).__name__}: "
                           f"{str(exc)[:200]})") from None
    _check_names(folder / WEIGHTS, _header_shapes(folder / WEIGHTS), layout)
    try:
        state = load_file(str(folder / WEIGHTS))
    except SafetensorError as exc:
        raise AdapterError(f"{folder / WEIGHTS}: not a safetensors file ({exc})") from None
    _check_values(folder / WEIGHTS, state)
    return config, state


def read_lora_config(path: Path):
    """The LoraConfig of an ``adapter_config.json``: its :data:`LORA_FIELDS`; an :class:`AdapterError` naming the
    first other field set to other than its default."""
    from peft import LoraConfig

    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{path}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise AdapterError(f"{path}: not a JSON object")
    default = LoraConfig()
    for key, value in raw.items():
        if key in LORA_FIELDS or key in INFO_FIELDS or key not in LoraConfig.__dataclass_fields__:
            continue
        if value not in (None, {}, [], False, _jsonable(getattr(default, key))):
            raise AdapterError(f"{path}: {key} is set; slea serve loads LoRA tensors only")
    if raw.get("bias", "none") != "none" or raw.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: expected peft_type LORA with bias none")
    return LoraConfig(**{k: v for k, v in raw.items() if k in LORA_FIELDS and k != "peft_type"},
                      init_lora_weights=False)


def lora_layout(model_config, config) -> dict[str, tuple[int, ...]]:
    """The LoRA tensors (peft's saved names) and their shapes that ``config`` gives a model of ``model_config``:
    peft's own wrapping of the model built on the meta device (no memory, no weights)."""
    import torch
    from peft import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from slea.policy.model import add_lora

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(model_config)
    state = get_peft_model_state_dict(add_lora(skeleton, config))
    return {k: tuple(v.shape) for k, v in state.items() if ".lora_" in k}


def swap_lora(model, config, state: dict):
    """``model`` with ``state`` (checked by :func:`read_lora`) as its one LoRA adapter. The new adapter is loaded
    beside the current one (or into a new peft wrapper of a bare model) and replaces it only once loaded: on any
    failure it is removed and ``model`` is as it was. Returns the peft model."""
    from peft import set_peft_model_state_dict

    from slea.policy.model import add_lora

    wrapped = hasattr(model, "peft_config")
    taken = set(getattr(model, "peft_config", {}))
    slot = next(f"lora{i}" for i in range(len(taken) + 1) if f"lora{i}" not in taken)
    new = model
    try:
        if wrapped:
            model.add_adapter(slot, config)
        else:
            new = add_lora(model, config, adapter_name=slot)
        unexpected = set_peft_model_state_dict(new, state, adapter_name=slot).unexpected_keys
        if unexpected:
            raise AdapterError(f"the adapter has tensors this model lacks, e.g. {unexpected[0]}")
    except BaseException:
        if wrapped and slot in model.peft_config:
            model.delete_adapter(slot)
        elif new is not model:
            new.unload()
        raise
    new.set_adapter(slot)
    for other in [a for a in new.peft_config if a != slot]:
        new.delete_adapter(other)
    return new


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (no __iter__)
    except (SafetensorError, OSError) as exc:
        raise AdapterError(f"{path}: not a safetensors file ({exc})") from None


def _check_names(path: Path, shapes: dict, layout: dict) -> None:
    example = next(iter(layout), "none")
    for name, shape in shapes.items():
        if name not in layout:
            raise AdapterError(f"{path}: holds {name}, which is not a LoRA tensor of its {CONFIG} (those are named "
                               f"like {example})")
        if shape != layout[name]:
            raise AdapterError(f"{path}: {name} has shape {list(shape)}, its {CONFIG} gives {list(layout[name])}")
    missing = [k for k in layout if k not in shapes]
    if missing:
        raise AdapterError(f"{path}: lacks {len(missing)} LoRA tensors of its {CONFIG}, e.g. {missing[0]}")


def _check_values(path: Path, state: dict) -> None:
    import torch

    for name, t in state.items():
        if not t.is_floating_point():
            raise AdapterError(f"{path}: {name} is {t.dtype}, not floating point")
        if not bool(torch.isfinite(t).all()):
            raise AdapterError(f"{path}: {name} holds NaN or infinite values")


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (set, tuple, list)):
        return [_jsonable(v) for v in (sorted(obj) if isinstance(obj, set) else obj)]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
