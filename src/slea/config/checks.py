"""The checks a run config gets beyond its types: names looked up in the registries they name, an algorithm's
options, snapshots for algorithms that fork, the env's constructor arguments (:func:`check_env_kwargs`, against
its signature), and the settings nothing on the chosen path reads (:func:`unused_settings`: an estimator's and a
loss's settings are their keyword-only parameters, found in the registry, a loss's under the names the schema's
:class:`LossKeywords` markers give; the single-agent trainer's are :data:`TRAINER_SETTINGS`; the team trainer's
are what slea/trainer/team_settings.py declares it reads, and it refuses every other). Pure functions over the
sections (slea.config.schema calls them from its validator); this module imports nothing of the schema at run
time (its annotations name the sections).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

if TYPE_CHECKING:
    from slea.algorithms.registry import AlgorithmSpec
    from slea.config.schema import AlgorithmSection, RunConfig

T = TypeVar("T")


def check_snapshots(spec: AlgorithmSpec, env_id: str, group_size: int, workers: str = "local") -> None:
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


def _constructor(cls: type) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool]:
    """The keyword parameters of ``cls``'s constructor, their resolved annotations, and whether it takes any
    keyword at all. A constructor with ``**kwargs`` passes them to its base class's (SearchQAToolsEnv's are
    SearchQAEnv's): the walk goes on up the classes; when that base is :class:`slea.envs.base.TextEnv` itself,
    which takes none, the ``**kwargs`` are the constructor's own and any keyword goes."""
    import typing

    from slea.envs.base import TextEnv

    params: dict[str, inspect.Parameter] = {}
    hints: dict[str, Any] = {}
    for klass in [k for k in cls.__mro__ if "__init__" in vars(k)]:
        if klass is TextEnv or not issubclass(klass, TextEnv):
            return params, hints, True
        init = vars(klass)["__init__"]
        own = [p for p in list(inspect.signature(init).parameters.values())[1:]
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        try:
            found = typing.get_type_hints(init)
        except (NameError, TypeError):  # an annotation that does not resolve: its values go unchecked
            found = {}
        for p in own:
            params.setdefault(p.name, p)
            if p.name in found:
                hints.setdefault(p.name, found[p.name])
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            return params, hints, False
    return params, hints, True


def _fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` has the type ``hint`` says (pydantic, strict: a string is no number, an int no bool, a
    float no int; an int is a float), or is one string where ``hint`` takes a sequence of strings (the families
    take one name for a list of names). A value YAML can write is checked as the JSON it is (a list stands for a
    tuple, a string for a path); another, given in code, as it is. An annotation pydantic cannot check passes."""
    import json

    from pydantic import ConfigDict, PydanticUserError, TypeAdapter, ValidationError

    try:
        adapter = TypeAdapter(hint, config=ConfigDict(strict=True, arbitrary_types_allowed=True))
    except (PydanticUserError, TypeError):
        return True
    candidates = (value, [value]) if isinstance(value, str) else (value,)
    for candidate in candidates:
        try:
            text = json.dumps(candidate)
        except (TypeError, ValueError):
            text = None
        try:
            adapter.validate_python(candidate) if text is None else adapter.validate_json(text)
            return True
        except ValidationError:
            pass
    return False


def check_env_kwargs(env_id: str, kwargs: dict[str, Any], key: str) -> None:
    """``kwargs`` (the config's ``key``: ``env.kwargs`` or ``env.eval_kwargs``) against the constructor of the
    class ``env_id`` builds, read from its signature without building an env (a family imports its engine only
    then), so that a misspelt keyword or a value of the wrong type is a config error before any model loads: each
    keyword is one of its parameters (:func:`_constructor`), each value fits its annotation (:func:`_fits`). What
    a signature cannot say (a family's ranges and names) its constructor checks when the env is built."""
    from slea.envs.base import env_class

    if not kwargs:
        return
    cls = env_class(env_id)
    params, hints, open_ = _constructor(cls)
    for name, value in kwargs.items():
        if name not in params and not open_:
            hint = did_you_mean(name, params)
            raise ValueError(f"{key}.{name}: not a keyword of {env_id} ({cls.__name__}); "
                             + (f"{hint} " if hint else "") + f"its keywords: {', '.join(params) or 'none'}")
        if name in hints and not _fits(hints[name], value):
            shown = params[name].annotation  # as written (a string under postponed annotations)
            shown = shown if isinstance(shown, str) else inspect.formatannotation(shown)
            raise ValueError(f"{key}.{name}: {env_id} ({cls.__name__}) takes {name}: {shown}, not "
                             f"{type(value).__name__} (got {value!r})")


def did_you_mean(word: str, options: Iterable[object], cutoff: float = 0.6) -> str:
    """``did you mean 'X'?`` for the option closest to ``word`` (difflib, case-insensitive), or '' when none is
    close enough (``cutoff``: difflib's similarity ratio) or ``word`` is itself one."""
    import difflib

    low = {str(o).lower(): str(o) for o in options}
    hit = difflib.get_close_matches(str(word).lower(), list(low), n=1, cutoff=cutoff)
    return f"did you mean {low[hit[0]]!r}?" if hit and low[hit[0]] != word else ""


def registered(key: str, get: Callable[[str], T], value: str) -> T:
    """``get(value)``, or a ValueError naming ``key`` that suggests the closest known name (a registry's
    KeyError lists them after ``known:``)."""
    try:
        return get(value)
    except (KeyError, TypeError, ImportError) as exc:
        msg = str(exc.args[0] if exc.args else exc)
        head, sep, known = msg.partition("; known: ")
        hint = did_you_mean(value, known.split(", ")) if sep and isinstance(value, str) else ""
        raise ValueError(f"{key}: {head}; {hint} known: {known}" if hint else f"{key}: {msg}") from None


# -- who reads a setting ----------------------------------------------------------------------------------------
# An algorithm reads its estimator's keyword-only parameters (AlgorithmSpec.settings) and a policy loss its own
# keyword-only parameters: the registry knows both from the signatures. A loss's parameters carry verl's names;
# the schema binds a config key to them where it declares the key (a LossKeywords marker on the field).
@dataclass(frozen=True)
class LossKeywords:
    """The keyword names a policy loss takes an ``algorithm.*`` setting as (verl's): the marker of the field, in
    ``Annotated[type, LossKeywords(...)]`` (slea/config/schema.py's AlgorithmSection)."""

    names: tuple[str, ...]


def loss_keywords(section: type[BaseModel]) -> dict[str, tuple[str, ...]]:
    """``key -> names`` for every field of ``section`` marked :class:`LossKeywords` (slea.config.LOSS_SETTINGS is
    AlgorithmSection's), in the section's field order."""
    return {key: m.names for key, field in section.model_fields.items()
            for m in field.metadata if isinstance(m, LossKeywords)}


@dataclass(frozen=True)
class Reader:
    """Trainer code that reads a setting: ``by``, its module under ``slea/`` (which names the setting; a test
    checks it); ``when(cfg, spec)``, whether the chosen path reads it (None: every path); ``why``, the refusal
    otherwise (``{name}``: the algorithm, ``{generator}``: model.generator)."""

    by: str
    when: Callable[[RunConfig, AlgorithmSpec], bool] | None = None
    why: str = ""


def _need(need: str, by: str, why: str) -> Reader:
    return Reader(by, lambda cfg, spec: need in spec.needs, f"algorithm {{name}} {why}")


# The settings the trainer reads whatever the estimator and the loss, and when: every algorithm.* key that no
# estimator or loss takes as a parameter is here (a key that names a section stands for each of its keys). The team
# trainer's own reads are declared beside it (slea/trainer/team_settings.py); :func:`_team_unread` refuses the rest.
TRAINER_SETTINGS: dict[str, Reader] = {
    "algorithm.name": Reader("trainer/select.py"),
    "algorithm.policy_loss": Reader("trainer/update.py"),
    "algorithm.options": Reader("config/checks.py"),  # the estimator's and loss's own settings (check_options)
    "algorithm.loss_agg": Reader("trainer/update.py"),  # weighs the micro-batches too, whatever the loss
    "algorithm.kl_coef": Reader("trainer/update.py"),
    "algorithm.kl_estimator": Reader("trainer/update.py", lambda cfg, spec: cfg.algorithm.kl_coef > 0
                                     or "reference" in spec.needs, "algorithm.kl_coef is 0"),
    "algorithm.entropy_coef": Reader("trainer/update.py", lambda cfg, spec: "team" not in spec.needs,
                                     "algorithm {name}'s update takes no entropy bonus"),
    "algorithm.skip_zero_advantage": Reader("trainer/rl.py"),
    "algorithm.old_logprobs": Reader("trainer/update.py"),
    "algorithm.tis_cap": Reader("trainer/update.py", lambda cfg, spec: cfg.algorithm.old_logprobs == "tis",
                                "algorithm.old_logprobs is not tis"),
    "algorithm.dynamic_sampling": Reader("rollout/schemes.py", lambda cfg, spec: "snapshots" not in spec.needs,
                                         "algorithm {name} forks from trunk boundaries"),
    "algorithm.max_refill_rounds": Reader("rollout/schemes.py", lambda cfg, spec: cfg.algorithm.dynamic_sampling,
                                          "algorithm.dynamic_sampling is off"),
    "rollout.max_batch": Reader("trainer/rl.py", lambda cfg, spec: cfg.model.generator == "hf",
                                "model.generator {generator} sends model.openai.batch_size prompts per request"),
    # what the trainer provides for an algorithm's needs (registry.NEEDS) is configured by these
    "algorithm.value_clip": _need("critic", "trainer/critic.py", "has no critic"),
    "algorithm.vf_coef": _need("critic", "trainer/critic.py", "has no critic"),
    "train.critic_lr": _need("critic", "trainer/critic.py", "has no critic"),
    "train.critic_updates": _need("critic", "trainer/critic.py", "has no critic"),
    "rollout.trunks": _need("snapshots", "rollout/schemes.py", "plays no trunks (it forks no siblings)"),
    "team": _need("team", "trainer/team.py", "trains no team"),
}


def _keyword_params(fn: Callable[..., Any]) -> set[str]:
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


class _Takers:
    """Every registered algorithm's settings and policy loss's keyword parameters (plugins included); ``section``:
    the algorithm section's class, whose fields say which keyword names a loss takes them as."""

    def __init__(self, section: type[BaseModel]) -> None:
        from slea.algorithms import registry

        self.algorithms = {n: set(registry.get_algorithm(n).settings) for n in registry.algorithm_names()}
        self.losses = {n: _keyword_params(registry.get_policy_loss(n)) for n in registry.policy_loss_names()}
        self.loss_keywords = loss_keywords(section)

    def of(self, key: str, *, option: bool = False) -> tuple[list[str], list[str]]:
        """The algorithms and the losses that take ``algorithm.<key>`` (``option``: ``algorithm.options.<key>``,
        which a loss takes under its own name rather than under the names its field's :class:`LossKeywords` give)."""
        names = {key} if option else set(self.loss_keywords.get(key, ()))
        return ([n for n, s in self.algorithms.items() if key in s],
                [n for n, p in self.losses.items() if names & p])


def _read_by(algorithms: list[str], losses: list[str]) -> str:
    parts = [f"{kind} {', '.join(who)}" for kind, who in (("algorithm", algorithms), ("policy_loss", losses)) if who]
    return f"; read by {' and '.join(parts)}" if parts else ""


def estimator_settings(algo: AlgorithmSection, spec: AlgorithmSpec) -> dict[str, Any]:
    """The settings ``spec``'s estimator takes, from ``algorithm.<key>`` or ``algorithm.options``."""
    fields = type(algo).model_fields
    out = {k: getattr(algo, k) for k in spec.settings if k in fields}
    out.update({k: v for k, v in algo.options.items() if k in spec.settings})
    return out


def loss_settings(algo: AlgorithmSection, loss: Callable[..., Any]) -> dict[str, Any]:
    """Keyword arguments of the policy loss ``loss``: the config's clip settings under verl's names (the fields'
    :class:`LossKeywords`), and its own extras from ``algorithm.options``."""
    params = _keyword_params(loss)
    out: dict[str, Any] = {}
    for key, names in loss_keywords(type(algo)).items():
        value = getattr(algo, key)
        if value is not None:
            out.update({n: value for n in names if n in params})
    out.update({k: v for k, v in algo.options.items() if k in params})
    return out


def check_options(algo: AlgorithmSection, spec: AlgorithmSpec, loss: Callable[..., Any]) -> None:
    fields = type(algo).model_fields
    params = _keyword_params(loss)
    for key in algo.options:
        if key in fields:
            raise ValueError(f"algorithm.options.{key}: set algorithm.{key} instead")
        if key not in spec.settings and key not in params:
            own = [k for k in spec.settings if k not in fields] or ["none"]
            raise ValueError(f"algorithm.options.{key}: not a setting of algorithm {spec.name} (its options: "
                             f"{', '.join(own)}) nor of policy_loss {algo.policy_loss}"
                             + _read_by(*_Takers(type(algo)).of(key, option=True)))
    for key in spec.required:
        if key not in fields and key not in algo.options:
            raise ValueError(f"algorithm.options.{key}: required by algorithm {spec.name}")


def _changed(cfg: BaseModel, dotted: str) -> list[str]:
    """``[dotted]`` when that setting differs from its default, or the keys under it that do when it names a
    section (:func:`_changed_leaves`: a nested section's key by key, so a refusal names the key that was set); else
    []."""
    parent_key, _, leaf = dotted.rpartition(".")
    parent = _value(cfg, parent_key) if parent_key else cfg
    value = getattr(parent, leaf)
    default = type(parent).model_fields[leaf].get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return _changed_leaves(value, default, f"{dotted}.")
    return [dotted] if value != default else []


def _changed_leaves(value: BaseModel, default: BaseModel, prefix: str) -> list[str]:
    """The dotted keys under ``prefix`` whose value in ``value`` differs from ``default``'s (a nested section's
    keys one by one)."""
    out = []
    for key in type(value).model_fields:
        mine, theirs = getattr(value, key), getattr(default, key)
        if isinstance(mine, BaseModel) and isinstance(theirs, BaseModel):
            out += _changed_leaves(mine, theirs, f"{prefix}{key}.")
        elif mine != theirs:
            out.append(f"{prefix}{key}")
    return out


def _team_unread(cfg: RunConfig, spec: AlgorithmSpec, loss_takes: Callable[[str], bool]) -> dict[str, str]:
    """For an algorithm the team trainer trains (one that needs a team and nothing else): every setting that
    differs from its default and that the team trainer does not read, ``key -> why``. What it reads is declared
    beside it (slea/trainer/team_settings.py: :data:`READS`, a key that names a section standing for each of its
    keys; :data:`DOES`, a setting it acts on as one fixed value whatever it says, which passes at that value); an
    ``algorithm.*`` key is read too when the estimator or the policy loss (``loss_takes``) takes it. Not the
    trainer's to refuse: ``plugins`` (the loader's) and the ``align`` section (``slea align``'s, whatever the
    algorithm). ``why`` says what the team trainer does instead where :data:`INSTEAD` says."""
    from slea.trainer.team_settings import DOES, INSTEAD, READS

    def read(dotted: str) -> bool:
        parts = dotted.split(".")
        return any(".".join(parts[:n]) in READS for n in range(1, len(parts) + 1))

    out: dict[str, str] = {}
    for section, field in type(cfg).model_fields.items():
        value = getattr(cfg, section)
        if section == "align" or not isinstance(value, BaseModel):
            continue
        default = field.get_default(call_default_factory=True)
        for dotted in _changed_leaves(value, default, f"{section}."):
            key = dotted.removeprefix("algorithm.") if section == "algorithm" else ""
            if read(dotted) or (key and (key in spec.settings or loss_takes(key))):
                continue
            if dotted in DOES and _value(cfg, dotted) == DOES[dotted]:
                continue
            hint = INSTEAD.get(dotted)
            out[dotted] = (f"algorithm {spec.name} trains a team, whose trainer (trainer/team.py) does not read it"
                           + (f"; it {hint}" if hint else ""))
    return out


def _value(cfg: BaseModel, dotted: str) -> Any:
    """The value of the dotted setting ``dotted`` in ``cfg``."""
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def unused_settings(cfg: RunConfig) -> dict[str, str]:
    """Settings that differ from their default although nothing on the chosen path reads them: ``key -> why``.

    ``algorithm.<key>`` is read when the chosen algorithm's estimator takes ``key`` as a keyword-only parameter,
    when the chosen policy loss takes it (under verl's name, :class:`LossKeywords`), or when the trainer reads it
    on this path (:data:`TRAINER_SETTINGS`, which also says when the other sections' keys are read); the refusal
    of an estimator's or loss's setting names the registered ones that read it. For an algorithm the team trainer
    trains, every other setting it does not read is refused too (:func:`_team_unread`). A value equal to its
    default changes nothing and passes (so a run's saved config.yaml, which lists every key, loads back)."""
    from slea.algorithms.registry import get_algorithm, get_policy_loss

    a = cfg.algorithm
    spec = get_algorithm(a.name)
    params = _keyword_params(get_policy_loss(a.policy_loss))
    takers = _Takers(type(a))

    def loss_takes(key: str) -> bool:
        return bool(params & set(takers.loss_keywords.get(key, ())))

    loss_reads = ", ".join(sorted(k for k in takers.loss_keywords if loss_takes(k))) or "none"
    fields = [f"algorithm.{k}" for k in type(a).model_fields]
    out: dict[str, str] = {}
    for dotted in [*fields, *(k for k in TRAINER_SETTINGS if k not in fields)]:
        key = dotted.removeprefix("algorithm.") if dotted in fields else ""
        algorithms, losses = takers.of(key) if key else ([], [])
        trainer = TRAINER_SETTINGS.get(dotted)
        if (key in spec.settings or loss_takes(key)
                or (trainer is not None and (trainer.when is None or trainer.when(cfg, spec)))):
            continue
        if algorithms:
            why = f"not a setting of algorithm {spec.name} (it reads: {', '.join(spec.settings) or 'none'})"
        elif losses:
            why = f"not read by policy_loss {a.policy_loss} (it reads: {loss_reads})"
        elif trainer is not None:
            why = trainer.why.format(name=spec.name, generator=cfg.model.generator)
        else:
            continue  # nothing declares it (tests/algorithms/test_settings.py: every algorithm.* key has a reader)
        out.update(dict.fromkeys(_changed(cfg, dotted), why + _read_by(algorithms, losses)))
    if spec.needs == {"team"}:  # one that needs a team and more has no trainer (slea/trainer/select.py says so)
        out.update({k: why for k, why in _team_unread(cfg, spec, loss_takes).items() if k not in out})
    return out
