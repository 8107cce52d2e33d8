"""The checks a run config gets beyond its types: names looked up in the registries they name, an algorithm's
options, snapshots for algorithms that fork, and the settings nothing on the chosen path reads
(:func:`unused_settings`). Pure functions over the sections (slea.config.schema calls them from its validator);
this module imports nothing of the schema.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def check_snapshots(spec, env_id: str, group_size: int, workers: str = "local") -> None:
    """An algorithm that forks rollouts from env snapshots needs an env that can take them, siblings, and (for
    now) the local pool: the sibling rounds restore snapshots into local copies."""
    from slea.envs.base import snapshot_support

    if "snapshots" not in spec.needs:
        return
    if snapshot_support(env_id) == "none":
        raise ValueError(f"algorithm.name: {spec.name} forks rollouts from env snapshots, but env.id {env_id} has "
                         f"neither get_state/set_state nor a replay fallback")
    if group_size < 2:
        raise ValueError(f"rollout.group_size: {spec.name} forks group_size − 1 siblings per turn boundary, so it "
                         f"must be >= 2 (got {group_size})")
    if workers != "local":
        raise ValueError(f"env.workers: {spec.name} plays its sibling rounds in local env copies; "
                         f"env.workers: {workers} is not supported with it (use local)")


def did_you_mean(word: str, options, cutoff: float = 0.6) -> str:
    """``did you mean 'X'?`` for the option closest to ``word`` (difflib, case-insensitive), or '' when none is
    close enough (``cutoff``: difflib's similarity ratio) or ``word`` is itself one."""
    import difflib

    low = {str(o).lower(): str(o) for o in options}
    hit = difflib.get_close_matches(str(word).lower(), list(low), n=1, cutoff=cutoff)
    return f"did you mean {low[hit[0]]!r}?" if hit and low[hit[0]] != word else ""


def registered(key: str, get, value: str):
    """``get(value)``, or a ValueError naming ``key`` that suggests the closest known name (a registry's
    KeyError lists them after ``known:``)."""
    try:
        return get(value)
    except (KeyError, TypeError, ImportError) as exc:
        msg = str(exc.args[0] if exc.args else exc)
        head, sep, known = msg.partition("; known: ")
        hint = did_you_mean(value, known.split(", ")) if sep and isinstance(value, str) else ""
        raise ValueError(f"{key}: {head}; {hint} known: {known}" if hint else f"{key}: {msg}") from None


# -- what the chosen algorithm reads ----------------------------------------------------------------------------
# config key -> the keyword names a policy loss takes it as (verl's names)
LOSS_SETTINGS: dict[str, tuple[str, ...]] = {
    "clip_eps": ("clip_ratio", "clip_ratio_low"),
    "clip_eps_high": ("clip_ratio_high",),
    "dual_clip_c": ("clip_ratio_c",),
    "loss_agg": ("loss_agg_mode",),
}
# keys that configure the learned critic: read only when the algorithm needs one
CRITIC_SETTINGS = (("algorithm", "value_clip"), ("algorithm", "vf_coef"), ("train", "critic_lr"),
                   ("train", "critic_updates"))


def _loss_params(loss) -> set[str]:
    import inspect

    return {p.name for p in inspect.signature(loss).parameters.values() if p.kind is p.KEYWORD_ONLY}


def estimator_settings(algo: BaseModel, spec) -> dict[str, Any]:
    """The settings ``spec``'s estimator takes, from ``algorithm.<key>`` or ``algorithm.options``."""
    fields = type(algo).model_fields
    out = {k: getattr(algo, k) for k in spec.settings if k in fields}
    out.update({k: v for k, v in algo.options.items() if k in spec.settings})
    return out


def loss_settings(algo: BaseModel, loss) -> dict[str, Any]:
    """Keyword arguments of the policy loss ``loss``: the config's clip settings under verl's names
    (:data:`LOSS_SETTINGS`), and its own extras from ``algorithm.options``."""
    params = _loss_params(loss)
    out: dict[str, Any] = {}
    for key, names in LOSS_SETTINGS.items():
        value = getattr(algo, key)
        if value is not None:
            out.update({n: value for n in names if n in params})
    out.update({k: v for k, v in algo.options.items() if k in params})
    return out


def check_options(algo: BaseModel, spec, loss) -> None:
    fields = type(algo).model_fields
    params = _loss_params(loss)
    for key in algo.options:
        if key in fields:
            raise ValueError(f"algorithm.options.{key}: set algorithm.{key} instead")
        if key not in spec.settings and key not in params:
            own = [k for k in spec.settings if k not in fields] or ["none"]
            raise ValueError(f"algorithm.options.{key}: not a setting of algorithm {spec.name} (its options: "
                             f"{', '.join(own)}) nor of policy_loss {algo.policy_loss}")
    for key in spec.required:
        if key not in fields and key not in algo.options:
            raise ValueError(f"algorithm.options.{key}: required by algorithm {spec.name}")


def unused_settings(cfg: BaseModel) -> dict[str, str]:
    """Settings that differ from their default although nothing on the chosen path reads them: ``key -> why``.

    Estimator settings are the chosen algorithm's keyword parameters; clip settings are read when the policy
    loss takes them (:data:`LOSS_SETTINGS`); critic settings when the algorithm needs a critic; the KL estimator
    when ``kl_coef`` > 0; ``max_refill_rounds`` with dynamic sampling. A value equal to its default changes
    nothing and passes (so a run's saved config.yaml, which lists every key, loads back)."""
    from slea.algorithms.registry import get_algorithm, get_policy_loss

    a = cfg.algorithm
    spec = get_algorithm(a.name)
    loss = get_policy_loss(a.policy_loss)
    params = _loss_params(loss)
    critic = "critic" in spec.needs
    estimator_reads = f"not a setting of algorithm {spec.name} (it reads: {', '.join(spec.settings) or 'none'})"
    loss_reads = sorted(k for k, names in LOSS_SETTINGS.items() if params & set(names))
    loss_why = f"not read by policy_loss {a.policy_loss} (it reads: {', '.join(loss_reads) or 'none'})"
    reads: dict[str, tuple[bool, str]] = {}
    for key in ("gamma", "step_weight", "std_norm", "eps", "gae_gamma", "gae_lambda", "turn_gamma", "turn_lambda",
                "adv_whiten"):
        reads[f"algorithm.{key}"] = (key in spec.settings, estimator_reads)
    for key, names in LOSS_SETTINGS.items():
        if key != "loss_agg":  # loss_agg also weighs micro-batches: always read
            reads[f"algorithm.{key}"] = (bool(params & set(names)), loss_why)
    for sec, key in CRITIC_SETTINGS:
        reads[f"{sec}.{key}"] = (critic, f"algorithm {spec.name} has no critic")
    no_bonus = f"algorithm {spec.name}'s update takes no entropy bonus"
    reads["algorithm.entropy_coef"] = ("team" not in spec.needs, no_bonus)
    reads["algorithm.kl_estimator"] = (a.kl_coef > 0 or "reference" in spec.needs, "algorithm.kl_coef is 0")
    reads["algorithm.max_refill_rounds"] = (a.dynamic_sampling, "algorithm.dynamic_sampling is off")
    forks = "snapshots" in spec.needs
    reads["algorithm.dynamic_sampling"] = (not forks, f"algorithm {spec.name} forks from trunk boundaries")
    reads["rollout.trunks"] = (forks, f"algorithm {spec.name} plays no trunks (it forks no siblings)")
    reads["rollout.max_batch"] = (cfg.model.generator == "hf", (f"model.generator {cfg.model.generator} sends "
                                                                 f"model.openai.batch_size prompts per request"))
    out = {}
    for dotted, (read, why) in reads.items():
        sec, key = dotted.split(".")
        section = getattr(cfg, sec)
        if not read and getattr(section, key) != type(section).model_fields[key].default:
            out[dotted] = why
    if "team" not in spec.needs:
        changed = [k for k, v in cfg.team.model_dump().items() if v != type(cfg.team)().model_dump()[k]]
        out.update({f"team.{k}": f"algorithm {spec.name} trains no team" for k in changed})
    return out
