"""Loading a run config: YAML, ``--set key.sub=value`` overrides (YAML scalars and lists), plugins imported
first, the algorithm's declared defaults, validation into :class:`slea.config.schema.RunConfig` (every error one
line naming the key: :class:`ConfigError`), and ``model.dtype: auto`` made concrete."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from slea.config.checks import did_you_mean
from slea.config.foreign import foreign_hint
from slea.config.schema import AlgorithmSection, ConfigError, RunConfig


def _one_line(err: ValidationError) -> str:
    e = err.errors()[0]
    key = ".".join(str(p) for p in e["loc"])
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        known = _keys_at(e["loc"][:-1])
        typo = did_you_mean(str(e["loc"][-1]), known, cutoff=0.8) if known else ""  # a likely slip of the keyboard
        hint = "" if typo else did_you_mean(str(e["loc"][-1]), known) if known else ""
        if typo or hint:  # the whole dotted key, as it is typed: rollout.group_size
            typo, hint = ((h.replace("'", "").replace("mean ", "mean " + "".join(f"{p}." for p in e["loc"][:-1]), 1)
                           if h else "") for h in (typo, hint))
        typed = _typed(key, e.get("input"))  # a new section's keys as they were typed: actor_rollout_ref.actor...
        foreign = "" if typo else foreign_hint(typed)  # a TRL or verl name: slea's (slea/config/foreign.py)
        if foreign:
            return f"{typed}: unknown key; {foreign}"
        hint = typo or hint
        return f"{key}: unknown key" + (f"; {hint}" if hint else "")
    if e["type"] == "literal_error":  # one of a fixed set of values: suggest the closest
        options = re.findall(r"'([^']*)'", str((e.get("ctx") or {}).get("expected", "")))
        hint = did_you_mean(str(e.get("input")), options) if isinstance(e.get("input"), str) else ""
        return f"{key}: {msg} (got {e.get('input')!r})" + (f"; {hint}" if hint else "")
    if e["type"] == "value_error" and not key:  # model-level validator already names its key
        return msg.removeprefix("Value error, ")
    if e["type"] == "value_error" and msg.startswith(f"Value error, {key}."):  # a section's validator names it
        return msg.removeprefix("Value error, ")
    return f"{key}: {msg} (got {e.get('input')!r})"


def _typed(key: str, value: Any) -> str:
    """``key`` followed by the first nested key path of ``value`` (an unknown section given as a dict, as
    ``--set a.b.c=1`` makes one): the key as the user typed it."""
    while isinstance(value, dict) and len(value) == 1:
        (sub, value), = value.items()
        key = f"{key}.{sub}"
    return key


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys a config section takes at ``loc`` (``()``: the sections), or [] where ``loc`` is no section."""
    from pydantic import BaseModel

    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field is not None else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"{item}: expected key=value")
    key, _, raw = item.partition("=")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def _set(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def build_config(data: dict[str, Any] | None = None, overrides: list[str] | None = None, *,
                 check_unused: bool = True, trains: bool = True) -> RunConfig:
    """The validated config of a YAML tree plus ``--set`` overrides. ``check_unused=False`` skips the refusal
    of settings the algorithm does not read (``slea compare`` checks them against all its algorithms).
    ``trains=False``: the config of a command that trains nothing (``slea agent``, ``slea eval``), so a served
    model needs no LoRA adapter and may use the chat API."""
    tree: dict[str, Any] = copy.deepcopy(dict(data or {}))  # overrides never change the caller's dict
    for item in overrides or []:
        path, value = parse_override(item)
        _set(tree, path, value)
    _import_plugins(tree.get("plugins"))
    _apply_algorithm_defaults(tree)
    try:
        cfg = RunConfig.model_validate(tree, context={"check_unused": check_unused, "trains": trains})
    except ValidationError as err:
        raise ConfigError(_one_line(err)) from None
    return _resolve_precision(cfg)


def _resolve_precision(cfg: RunConfig) -> RunConfig:
    """``model.dtype: auto`` made concrete for the device the run uses (slea/precision.py), then π_old's source;
    an explicit bf16 on a CPU that emulates it gets a warning."""
    from slea.precision import device_native_bf16, resolve_dtype, warn_if_slow

    if cfg.model.dtype != "auto":
        warn_if_slow(cfg.model.dtype, cfg.run.device)
    else:
        # an explicit bf16 base computes in bf16 whatever the hardware
        native = cfg.model.base_dtype.startswith("bfloat16") or device_native_bf16(cfg.run.device)
        model = cfg.model.model_copy(update={"dtype": resolve_dtype("auto", native_bf16=native)})
        cfg = cfg.model_copy(update={"model": model})
    return _resolve_old_logprobs(cfg)


def _resolve_old_logprobs(cfg: RunConfig) -> RunConfig:
    """``algorithm.old_logprobs: auto`` made concrete for the run's engine, device and precision
    (slea/precision.py); the saved config records it, so a resumed run keeps its π_old. An algorithm that trains
    a team gets ``recompute``, what its trainer does whatever the setting (slea/trainer/team.py)."""
    import torch

    from slea.algorithms.registry import get_algorithm
    from slea.precision import resolve_old_logprobs

    if cfg.algorithm.old_logprobs != "auto":
        return cfg
    on_cpu = cfg.run.device == "cpu" or (cfg.run.device == "auto" and not torch.cuda.is_available())
    mode = "recompute" if "team" in get_algorithm(cfg.algorithm.name).needs else resolve_old_logprobs(
        "auto", generator=cfg.model.generator, device_type="cpu" if on_cpu else "cuda", dtype=cfg.model.dtype,
        base_dtype=cfg.model.base_dtype)
    return cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update={"old_logprobs": mode})})


def _import_plugins(plugins: Any) -> None:
    from slea.plugins import import_plugin

    if plugins is None:
        return
    if not isinstance(plugins, list) or not all(isinstance(m, str) and m.strip() for m in plugins):
        raise ConfigError(f"plugins: expected a list of module names (got {plugins!r})")
    for module in plugins:
        try:
            import_plugin(module.strip())
        except ImportError as exc:
            raise ConfigError(f"plugins: {exc}") from None


def _apply_algorithm_defaults(tree: dict[str, Any]) -> None:
    """Fill the config values the chosen algorithm declares (``AlgorithmSpec.defaults``) where the tree has
    none; an unknown algorithm is left for validation to report."""
    from slea.algorithms.registry import get_algorithm

    algo = tree.get("algorithm")
    name = algo.get("name", AlgorithmSection().name) if isinstance(algo, dict) else AlgorithmSection().name
    try:
        spec = get_algorithm(name)
    except (KeyError, TypeError, ImportError):
        return
    for dotted, value in spec.defaults.items():
        *sections, key = dotted.split(".")
        node = tree
        for sec in sections:
            child = node.get(sec)
            if child is None:
                child = node[sec] = {}
            if not isinstance(child, dict):
                break
            node = child
        else:
            node.setdefault(key, value)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                check_unused: bool = True, trains: bool = True) -> RunConfig:
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config: no such file {str(p)!r}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config: {p.name} is not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config: {p.name} must hold a mapping of sections")
    return build_config(data, overrides, check_unused=check_unused, trains=trains)


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
