"""Checkpoints: trainable weights, optimizer, RNG states, the experience library and the iteration, written
atomically and validated on load.

Only safetensors, JSON and SQLite are written and read, never pickles, so loading a run folder cannot execute
code (files with other names in a checkpoint folder, a planted ``*.pt`` or ``*.pkl``, are never opened).
A trainer names a checkpoint by the steps it holds, as every log line counts them (from 1): ``iter_000012`` holds
iteration 12 (its ``state.json`` keeps the step's index, 11, from which a resumed run continues). Layout of
``checkpoints/iter_000012/``:

* ``trainable.safetensors`` — LoRA adapters, or all weights (a team run: every agent's adapter);
* ``optimizer.safetensors`` + ``optimizer.json`` — moments and step counts, param groups (a team run: every
  agent's optimizer, as one :class:`OptimizerSet`);
* ``rng.safetensors`` + ``state.json`` — iteration, RNG states of python and numpy (torch's CPU generator in
  the safetensors, and each CUDA device's when the run uses CUDA), and whatever the trainer adds (episodes, env
  seeds, guard counters);
* ``library.sqlite`` — a consistent snapshot (SQLite online backup) of the run's experience library, when
  the run has one;
* ``manifest.json`` — written last: size and SHA-256 of every file above.

A checkpoint folder is built under a temporary name, every file fsynced, and renamed into place, so a killed
writer never leaves a half checkpoint; the last ``keep`` are kept. :func:`load_checkpoint` checks the manifest
and reads every file into memory *before* touching the model, so a damaged checkpoint raises
:class:`CheckpointError` and changes nothing; :func:`load_latest` walks back from the newest checkpoint to the
first one that loads, warning about each one it skips. The JSON files are read as untrusted input: capped in size
(:data:`JSON_CAPS`) and depth, each of its schema's shape (:class:`Manifest`, :class:`CheckpointState`,
:class:`OptimizerMeta`; slea/runs/jsonfile.py), and a checkpoint that is, or holds, a link leading out of its run
is foreign (:func:`check_own`): each is damaged, and skipped like a truncated one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeAlias

import numpy as np
import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from safetensors.torch import load_file, save_file

from slea.device import cuda_rng_states
from slea.runs.folder import LIBRARY, RunFolder
from slea.runs.jsonfile import MAX_BYTES, MIB, Loose, RunFileError, read_json, schema_error
from slea.runs.sqlite import snapshot_sqlite

log = logging.getLogger(__name__)

PREFIX = "iter_"
MANIFEST = "manifest.json"
CRITIC = "critic.safetensors"  # the PPO / Turn-PPO value head and its optimizer (slea/trainer/critic.py)
# The only files a checkpoint is made of, and so the only ones ever read from it.
FILES = ("trainable.safetensors", "optimizer.safetensors", "optimizer.json", "rng.safetensors", "state.json",
         LIBRARY, CRITIC)


class CheckpointError(ValueError):
    """A checkpoint folder is missing files, damaged, or does not fit the model."""


# What a checkpoint holds the weights of: a model (its trainable parameters) or a ``{name: tensor}`` mapping.
Weights: TypeAlias = "torch.nn.Module | Mapping[str, torch.Tensor]"


class OptimizerState(Protocol):
    """What a checkpoint saves and restores of an optimizer: a ``torch.optim.Optimizer`` or an
    :class:`OptimizerSet`."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any], /) -> None: ...


# -- optimizer and RNG as tensors + JSON ------------------------------------------------------------------
def _flatten_optimizer(optimizer: OptimizerState) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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
    """The RNG states as safetensors-ready tensors (torch's CPU generator, and every CUDA device's as
    ``cuda.<i>`` when CUDA is in use) and JSON (python's, numpy's)."""
    py = random.getstate()
    tensors = {"torch": torch.get_rng_state()}
    tensors.update({f"cuda.{i}": t for i, t in enumerate(cuda_rng_states() or [])})
    return tensors, {"python": [py[0], list(py[1]), py[2]], "numpy": np.random.get_state(legacy=False)}


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted((k for k in tensors if k.startswith("cuda.")), key=lambda k: int(k[5:]))]
    if cuda:
        if torch.cuda.is_available():
            for i, t in enumerate(cuda[:torch.cuda.device_count()]):
                torch.cuda.set_rng_state(t, i)
        else:  # a GPU run resumed on a CPU machine: its CPU stream continues, the GPU streams have nowhere to go
            log.warning("checkpoint holds the RNG state of %d CUDA device(s); torch sees none here", len(cuda))
    v, state, gauss = meta["python"]
    random.setstate((v, tuple(state), gauss))
    np.random.set_state(meta["numpy"])


class OptimizerSet:
    """Several optimizers checkpointed as one (a team's one AdamW per agent): ``state_dict`` lists the param groups
    of all of them in order, their per-parameter states renumbered after each other, so :func:`save_checkpoint`
    and :func:`load_checkpoint` store and validate it exactly as one optimizer."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = list(optimizers)

    def state_dict(self) -> dict[str, Any]:
        state: dict[int, Any] = {}
        groups: list[dict[str, Any]] = []
        offset = 0
        for opt in self.optimizers:
            sd = opt.state_dict()
            n = sum(len(g["params"]) for g in sd["param_groups"])
            state.update({offset + int(i): st for i, st in sd["state"].items()})
            groups += [{**g, "params": [offset + int(i) for i in g["params"]]} for g in sd["param_groups"]]
            offset += n
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        groups, offset = list(sd["param_groups"]), 0
        for opt in self.optimizers:
            mine = groups[:len(opt.param_groups)]
            groups = groups[len(opt.param_groups):]
            n = sum(len(g["params"]) for g in mine)
            opt.load_state_dict({
                "state": {int(i) - offset: st for i, st in sd["state"].items() if offset <= int(i) < offset + n},
                "param_groups": [{**g, "params": [int(i) - offset for i in g["params"]]} for g in mine]})
            offset += n


# -- weights --------------------------------------------------------------------------------------------
def _parameters(model: Weights) -> dict[str, torch.Tensor]:
    """A model's parameters by name; ``model`` may also be a ``{name: parameter}`` mapping (a team's adapters)."""
    return dict(model) if isinstance(model, Mapping) else dict(model.named_parameters())


def save_trainable(model: Weights, path: Path) -> None:
    """The trainable parameters of ``model`` (those requiring gradients), or every tensor of a mapping."""
    items = model.items() if isinstance(model, Mapping) else (
        (n, p) for n, p in model.named_parameters() if p.requires_grad)
    save_file({n: p.detach().cpu().contiguous() for n, p in items}, str(path))


def _check_trainable(model: Weights, state: dict[str, torch.Tensor], path: Path) -> None:
    params = _parameters(model)
    missing = [n for n in state if n not in params]
    if missing:
        raise CheckpointError(f"checkpoint {path} has weights this model lacks, e.g. {missing[0]}")
    lacking = [n for n in params if n not in state] if isinstance(model, Mapping) else []  # a mapping: all of it
    if lacking:
        raise CheckpointError(f"checkpoint {path} lacks weights, e.g. {lacking[0]}")
    for name, t in state.items():
        if tuple(t.shape) != tuple(params[name].shape):
            raise CheckpointError(f"checkpoint {path}: {name} has shape {tuple(t.shape)}, the model "
                                  f"{tuple(params[name].shape)}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"checkpoint {path}: {name} holds non-finite values")


def _copy_trainable(model: Weights, state: dict[str, torch.Tensor]) -> None:
    params = _parameters(model)
    with torch.no_grad():
        for name, t in state.items():
            params[name].copy_(t)


def load_trainable(model: Weights, folder: str | Path) -> None:
    """Load ``trainable.safetensors`` into the model's trainable parameters (names and shapes must match)."""
    path = Path(folder)
    if path.is_dir():
        path = path / "trainable.safetensors"
    state = _read_safetensors(path)
    _check_trainable(model, state, path)
    _copy_trainable(model, state)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} is unreadable: it is missing") from None
    except Exception as exc:  # noqa: BLE001  (safetensors raises its own error types on a damaged header)
        raise CheckpointError(f"checkpoint file {path} is unreadable: {type(exc).__name__}: {exc}") from None


# -- the checkpoint's JSON files: their caps and schemas (slea/runs/jsonfile.py reads them) ----------------------
Count = Annotated[int, Field(strict=True, ge=0)]  # strict: true / 1.0 / "1" are not counts
Seconds = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class FileEntry(BaseModel):
    """One file of a manifest: its size and SHA-256."""

    model_config = ConfigDict(extra="forbid")
    bytes: Count
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _only_checkpoint_files(files: Any) -> Any:
    """A manifest lists a checkpoint's own files (:data:`FILES`) and nothing else, so nothing else is ever read."""
    for name in files if isinstance(files, dict) else ():
        if name not in FILES:
            raise ValueError(f"lists an unexpected file {name!r}")
    return files


class Manifest(Loose):
    """``manifest.json``: every file of the checkpoint with its size and checksum."""

    iteration: Count | None = None
    files: Annotated[dict[str, FileEntry], BeforeValidator(_only_checkpoint_files)]


def _stage(v: Any) -> Any:
    if isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
        return v
    raise ValueError(f"expected a stage number or name, got {v!r:.60}")


class CheckpointState(Loose):
    """``state.json`` as the trainers write it (slea/trainer/rl.py, slea/trainer/team_checkpoint.py, the alignment
    pipeline): ``iteration`` and the counters non-negative integers, the seconds finite and non-negative, ``betas``
    and ``next_env_seeds`` lists of finite numbers, ``critic`` and ``pending`` objects or null; ``rng`` is checked
    apart (:func:`check_state`: only a run that restores it needs it)."""

    iteration: Count
    episodes: Count = 0
    env_steps: Count = 0
    rollouts: Count = 0
    processes: Count = 1
    bad_update_streak: Count = 0
    updates: Count = 0
    messages: Count = 0
    position: Count = 0
    stage: Annotated[Any, BeforeValidator(_stage)] = None
    wall_s: Seconds = 0.0
    train_s: Seconds = 0.0
    betas: list[Number] = Field(default_factory=list)
    next_env_seeds: list[Number] = Field(default_factory=list)
    critic: dict[str, Any] | None = None
    pending: dict[str, Any] | None = None


class ParamGroup(Loose):
    """One param group of ``optimizer.json``: its parameters' indices (and its settings: lr, betas...)."""

    params: list[Count]


class OptimizerMeta(Loose):
    """``optimizer.json``: the param groups and the per-parameter scalars (by parameter index)."""

    param_groups: list[ParamGroup]
    scalars: dict[Annotated[str, Field(pattern=r"^[0-9]+$")], dict[str, Any]] = Field(default_factory=dict)


# the most bytes each may have (far above what a run writes: the state's RNG states are some kB, a team's pending
# rollouts a few MB)
JSON_CAPS = {MANIFEST: MIB, "state.json": 64 * MIB, "optimizer.json": 16 * MIB}
SCHEMAS: dict[str, type[BaseModel]] = {MANIFEST: Manifest, "state.json": CheckpointState,
                                       "optimizer.json": OptimizerMeta}


def _read_json(path: Path) -> Any:
    """A checkpoint's JSON file, capped and of its schema (:data:`JSON_CAPS`, :data:`SCHEMAS`), or a
    :class:`CheckpointError` naming the checkpoint and what is wrong."""
    try:
        return read_json(path, SCHEMAS.get(path.name), max_bytes=JSON_CAPS.get(path.name, MAX_BYTES))
    except RunFileError as exc:
        raise CheckpointError(f"checkpoint {path.parent} is unreadable: {exc}") from None


# -- files ------------------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def restore_library(checkpoint: str | Path | None, dst: str | Path) -> bool:
    """Make ``dst`` the library as of ``checkpoint`` (its ``library.sqlite``), or remove it when the checkpoint
    has none or is ``None`` (a run resumed from scratch starts with an empty library). The stale ``-wal`` and
    ``-shm`` files go first, so SQLite never replays a newer journal onto the restored file. The database must
    not be open. Returns whether a library was restored."""
    dst = Path(dst)
    for suffix in ("-wal", "-shm", "-journal"):
        Path(f"{dst}{suffix}").unlink(missing_ok=True)
    src = Path(checkpoint) / LIBRARY if checkpoint is not None else None
    if src is None or not src.is_file():
        dst.unlink(missing_ok=True)
        return False
    tmp = dst.with_name(f".{dst.name}.restore")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return True


# -- save -------------------------------------------------------------------------------------------------
def save_checkpoint(root: str | Path, iteration: int, model: Weights, optimizer: OptimizerState,
                    extra: dict[str, Any] | None = None, keep: int = 2, library: str | Path | None = None,
                    critic: dict[str, torch.Tensor] | None = None, number: int | None = None) -> Path:
    """Write ``root/iter_<number>`` atomically (``number`` default ``iteration``: a trainer passes the steps done,
    ``iteration + 1``, so the folder reads as its log lines count); ``state.json`` records ``iteration``, from which
    a resumed run continues; ``library``: the run's SQLite library file to snapshot.

    ``model``: a model (its trainable parameters) or a ``{name: parameter}`` mapping; ``optimizer``: an
    optimizer or an :class:`OptimizerSet`. The same go to :func:`load_checkpoint`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{iteration if number is None else number:06d}"
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
    if library is not None and Path(library).is_file():
        snapshot_sqlite(library, tmp / LIBRARY)
    if critic is not None:
        save_file(critic, str(tmp / CRITIC))
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir())}
    (tmp / MANIFEST).write_text(json.dumps({"iteration": iteration, "files": files}))
    for p in tmp.iterdir():
        _fsync(p)
    _fsync(tmp)
    old = None
    if final.exists():  # re-saving an iteration (a resumed run redoes it): keep the old until the new is in
        old = root / f".old-{final.name}"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    _fsync(root)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    for stale in list_checkpoints(root)[:-keep]:
        gone = root / f".del-{stale.name}"  # renamed first: a killed pruning never leaves a half checkpoint
        shutil.rmtree(gone, ignore_errors=True)
        stale.rename(gone)
        shutil.rmtree(gone, ignore_errors=True)
    return final


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# -- find and validate -------------------------------------------------------------------------------------
def list_checkpoints(root: str | Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
                  and (p / "state.json").is_file())


def latest_checkpoint(root: str | Path, say: Callable[[str], None] | None = None) -> Path | None:
    """The newest checkpoint that passes :func:`check_readable` (its manifest, its ``state.json``, and without a
    manifest its weights' safetensors); damaged ones are skipped, each told to ``say`` in one line (default: a
    logged warning)."""
    for path in reversed(list_checkpoints(root)):
        try:
            check_readable(path)
        except CheckpointError as exc:
            (say or log.warning)(f"skipping damaged checkpoint {path.name}: {exc}")
            continue
        return path
    return None


def run_checkpoint(run: str | Path, name: str | None = None, say: Callable[[str], None] | None = None) -> Path:
    """A run folder's newest usable checkpoint (each damaged newer one skipped is told to ``say`` in one line), or
    the one named ``name`` (``iter_000006``, or ``6``: after iteration 6; damaged: an error, never another one), or
    :class:`CheckpointError` naming the run: re-evaluating, serving or playing a run without its weights would
    silently measure the untrained model. (Checkpoints are not kept in the repository: a saved run's config,
    metrics and eval stay, its weights stay on the machine that trained it.)"""
    root = RunFolder(run).checkpoints
    if name is not None:
        path = root / (f"{PREFIX}{int(name):06d}" if name.isdigit() else name)
        if "/" in name or "\\" in name or not path.name.startswith(PREFIX) or not path.is_dir():
            have = ", ".join(p.name for p in list_checkpoints(root)) or "none"
            raise CheckpointError(f"run {run} has no checkpoint {name!r} (checkpoints: {have})")
        check_readable(path)
        return path
    last = latest_checkpoint(root, say)
    if last is None:
        raise CheckpointError(f"run {run} has no usable checkpoint under {root}: its "
                              f"trained weights are not here, so it cannot be evaluated, served or played")
    return last


def check_readable(folder: str | Path) -> None:
    """What a command that plays a run's weights needs of a checkpoint, checked without applying anything:
    :func:`verify_checkpoint`, a well-formed ``state.json`` (:func:`check_state`, RNG states aside: nothing
    restores them) and, for a checkpoint without a manifest (no checksums), weights that parse."""
    folder = Path(folder)
    manifest = verify_checkpoint(folder)
    check_state(_read_json(folder / "state.json"), folder, rng=False)
    if not manifest.get("files"):
        _read_safetensors(folder / "trainable.safetensors")


def check_state(state: Any, folder: str | Path, rng: bool = True) -> dict[str, Any]:
    """``state.json`` checked before anything is applied: of :class:`CheckpointState`'s shape and, with ``rng``,
    holding python's and numpy's RNG states as those libraries accept them. A :class:`CheckpointError` naming the
    first field that is not; the state as it was read otherwise."""
    def bad(key: str, why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {folder} is unreadable: state.json: {key}: {why}")

    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {folder} is unreadable: state.json is not a JSON object")
    try:
        CheckpointState.model_validate(state)
    except ValidationError as exc:
        raise CheckpointError(f"checkpoint {folder} is unreadable: state.json: {schema_error(exc)}") from None
    if rng:
        meta = state.get("rng")
        if not isinstance(meta, dict) or "python" not in meta or "numpy" not in meta:
            raise bad("rng", "expected python's and numpy's RNG states")
        try:
            v, st, gauss = meta["python"]
            random.Random().setstate((v, tuple(st), gauss))  # a scratch generator: the global one is untouched
        except (TypeError, ValueError, IndexError, OverflowError) as exc:
            raise bad("rng.python", f"not a python RNG state ({exc})") from None
        try:
            np.random.RandomState().set_state(meta["numpy"])
        except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:
            raise bad("rng.numpy", f"not a numpy RNG state ({type(exc).__name__}: {exc})") from None
    return state


def trained_processes(run: str | Path) -> int:
    """How many data-parallel processes wrote the run's newest usable checkpoint (``processes`` in its
    ``state.json``), so ``slea train --resume`` restarts as many: 1 for a one-process run, for a checkpoint
    older than the field, and for a run without a usable checkpoint."""
    last = latest_checkpoint(RunFolder(run).checkpoints)
    if last is None:
        return 1
    try:
        n: int = _read_json(last / "state.json").get("processes", 1)
    except CheckpointError:
        return 1
    return max(n, 1)


def check_own(folder: str | Path) -> None:
    """A checkpoint belongs to its run: a :class:`CheckpointError` when the folder (or the ``checkpoints`` folder
    above it) is a link that leads out of the run folder (``<run>/checkpoints/<name>``), or when one of its files is
    a link. Another run's weights, optimizer and RNG states would otherwise be used silently."""
    folder = Path(folder).absolute()
    run = folder.parent.parent
    real = folder.resolve()
    if not real.is_relative_to(run.resolve()):
        raise CheckpointError(f"checkpoint {folder} is foreign: it leads to {real}, outside its run {run}")
    links = [name for name in (*FILES, MANIFEST) if (folder / name).is_symlink()]
    if links:
        raise CheckpointError(f"checkpoint {folder} is foreign: its {links[0]} is a link (to "
                              f"{(folder / links[0]).resolve()})")


def verify_checkpoint(folder: str | Path) -> dict[str, Any]:
    """Check a checkpoint's files against its manifest (sizes and SHA-256); returns the manifest.

    A checkpoint written before manifests existed is accepted when its required files are present (they are
    fully parsed by :func:`load_checkpoint` anyway)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} does not exist")
    check_own(folder)
    required = ("trainable.safetensors", "state.json", "rng.safetensors")
    if not (folder / MANIFEST).is_file():
        missing = [f for f in required if not (folder / f).is_file()]
        if missing:
            raise CheckpointError(f"checkpoint {folder} is unreadable: it lacks {', '.join(missing)}")
        return {"files": {}}
    manifest: dict[str, Any] = _read_json(folder / MANIFEST)
    files = manifest["files"]
    for name in required:
        if name not in files:
            raise CheckpointError(f"checkpoint {folder} is unreadable: {MANIFEST} does not list {name}")
    for name, meta in files.items():  # only names of FILES (the schema refused any other)
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {folder} is unreadable: {name} is missing")
        if path.stat().st_size != meta["bytes"]:
            raise CheckpointError(f"checkpoint {folder} is unreadable: {name} has {path.stat().st_size} bytes, "
                                  f"the manifest says {meta['bytes']} (truncated or overwritten)")
        if _sha256(path) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {folder} is unreadable: {name} does not match its checksum")
    return manifest


def load_checkpoint(folder: str | Path, model: Weights, optimizer: OptimizerState | None = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Restore weights (and optimizer, RNG) from a checkpoint folder; returns its ``state.json``.

    Every file is verified and parsed before anything is applied, so a damaged checkpoint raises
    :class:`CheckpointError` (a ``ValueError``) and leaves model, optimizer and RNG untouched."""
    folder = Path(folder)
    verify_checkpoint(folder)
    state = check_state(_read_json(folder / "state.json"), folder, rng=restore_rng)
    weights = _read_safetensors(folder / "trainable.safetensors")
    _check_trainable(model, weights, folder / "trainable.safetensors")
    opt_sd = None
    if optimizer is not None:
        meta = _read_json(folder / "optimizer.json")
        opt_sd = _unflatten_optimizer(_read_safetensors(folder / "optimizer.safetensors"), meta)
        groups = optimizer.state_dict()["param_groups"]
        if len(opt_sd["param_groups"]) != len(groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(opt_sd["param_groups"], groups)):
            raise CheckpointError(f"checkpoint {folder}: the optimizer state does not fit this model")
    rng_t = _read_safetensors(folder / "rng.safetensors") if restore_rng else None
    if rng_t is not None:
        if "torch" not in rng_t or "rng" not in state:
            raise CheckpointError(f"checkpoint {folder}: RNG state incomplete")
        try:  # the torch state's shape and type, on a scratch generator (the global one is untouched)
            torch.Generator().set_state(rng_t["torch"])
        except (RuntimeError, TypeError) as exc:
            raise CheckpointError(f"checkpoint {folder}: rng.safetensors: not a torch RNG state ({exc})") from None
    # Everything parsed: apply.
    _copy_trainable(model, weights)
    if optimizer is not None and opt_sd is not None:
        optimizer.load_state_dict(opt_sd)
    if rng_t is not None:
        set_rng_state(rng_t, state["rng"])
    return state


def load_critic(folder: str | Path) -> dict[str, torch.Tensor] | None:
    """The critic tensors of a checkpoint (``critic.safetensors``), or ``None`` when it has none."""
    path = Path(folder) / CRITIC
    return _read_safetensors(path) if path.is_file() else None


def load_latest(root: str | Path, model: Weights, optimizer: OptimizerState | None = None,
                restore_rng: bool = True) -> tuple[Path | None, dict[str, Any] | None]:
    """Load the newest checkpoint under ``root`` that is intact; a damaged one (missing or corrupt files, a
    half-written folder) is skipped with a warning and the previous one tried. ``(None, None)`` when none
    loads."""
    for path in reversed(list_checkpoints(root)):
        try:
            return path, load_checkpoint(path, model, optimizer, restore_rng=restore_rng)
        except CheckpointError as exc:
            log.warning("skipping damaged checkpoint %s: %s", path.name, exc)
    return None, None
