"""Checkpoints: trainable weights, optimizer, RNG states and the iteration, written atomically.

Only safetensors and JSON are written and read, never pickles, so loading a run folder cannot execute code.
Layout of ``checkpoints/iter_000012/``: ``trainable.safetensors`` (LoRA adapters, or all weights),
``optimizer.safetensors`` + ``optimizer.json``, ``rng.safetensors`` + ``state.json`` (iteration, RNG states of
python and numpy, and whatever the trainer adds). A checkpoint folder is built under a temporary name and
renamed into place, so a killed writer never leaves a half checkpoint; the last ``keep`` are kept.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

PREFIX = "iter_"


def _flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for key, val in st.items():
            if torch.is_tensor(val):
                tensors[f"{idx}.{key}"] = val.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, t in tensors.items():
        idx, _, key = name.partition(".")
        state.setdefault(int(idx), {})[key] = t
    for idx, vals in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(vals)
    return {"state": state, "param_groups": meta["param_groups"]}


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    py = random.getstate()
    return ({"torch": torch.get_rng_state()},
            {"python": [py[0], list(py[1]), py[2]], "numpy": np.random.get_state(legacy=False)})


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    v, state, gauss = meta["python"]
    random.setstate((v, tuple(state), gauss))
    np.random.set_state(meta["numpy"])


def save_trainable(model, path: Path) -> None:
    state = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    save_file(state, str(path))


def load_trainable(model, folder: str | Path) -> None:
    """Load ``trainable.safetensors`` into the model's trainable parameters (names must match)."""
    path = Path(folder)
    if path.is_dir():
        path = path / "trainable.safetensors"
    state = load_file(str(path))
    params = dict(model.named_parameters())
    missing = [n for n in state if n not in params]
    if missing:
        raise ValueError(f"checkpoint {path} has weights this model lacks, e.g. {missing[0]}")
    with torch.no_grad():
        for name, t in state.items():
            params[name].copy_(t)


def save_checkpoint(root: str | Path, iteration: int, model, optimizer, extra: dict[str, Any] | None = None,
                    keep: int = 2) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{iteration:06d}"
    tmp = root / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_trainable(model, tmp / "trainable.safetensors")
    opt_t, opt_meta = _flatten_optimizer(optimizer)
    save_file(opt_t, str(tmp / "optimizer.safetensors"))
    (tmp / "optimizer.json").write_text(json.dumps(opt_meta))
    rng_t, rng_meta = rng_state()
    save_file(rng_t, str(tmp / "rng.safetensors"))
    state = {"iteration": iteration, "rng": rng_meta, **(extra or {})}
    (tmp / "state.json").write_text(json.dumps(state, default=_jsonable))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def list_checkpoints(root: str | Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
                  and (p / "state.json").is_file())


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(folder: str | Path, model, optimizer=None, restore_rng: bool = True) -> dict[str, Any]:
    """Restore weights (and optimizer, RNG) from a checkpoint folder; returns its ``state.json``."""
    folder = Path(folder)
    try:
        state = json.loads((folder / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"checkpoint {folder} is unreadable: {exc}") from None
    load_trainable(model, folder)
    if optimizer is not None:
        meta = json.loads((folder / "optimizer.json").read_text())
        optimizer.load_state_dict(_unflatten_optimizer(load_file(str(folder / "optimizer.safetensors")), meta))
    if restore_rng:
        set_rng_state(load_file(str(folder / "rng.safetensors")), state["rng"])
    return state
