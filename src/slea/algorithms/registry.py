"""The algorithm and policy-loss registries: each algorithm declares at registration what it needs.

An algorithm is its advantage estimator plus a spec (:class:`AlgorithmSpec`): the *level* its advantage lives
at (``token``, ``turn``, ``trajectory``), what the trainer must *provide* for it (a learned critic, observation
clusters, a reference model, env snapshots, a team of agents, offline data), and config values it implies unless
the user sets them. Its *settings* are the estimator's keyword-only parameters, read from ``algorithm.<name>``
(or ``algorithm.options``); a policy loss's are its own keyword-only parameters. The config check reads the same
signatures (slea.config.checks), so a new parameter is a setting with no table to edit. The trainer reads the
spec, never the name::

    @register_algorithm("my_estimator", level="trajectory")
    def my_estimator(batch: StepBatch, *, eps: float) -> np.ndarray:   # one advantage per step row
        ...

Names are case-insensitive and ``-`` equals ``_``. Outside the package, a config names a plugin module
(``plugins: [my_pkg.algos]``) or the estimator itself (``algorithm.name: my_pkg.algos:my_estimator``); either
imports the module, whose decorators register it. Unknown names raise :class:`KeyError` listing the known ones.
Built on :class:`slea.plugins.Registry` (standard library only): the built-in algorithms (numpy) are
imported on first lookup, the built-in policy losses (torch) on first loss lookup.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from slea.plugins import Registry, norm_name

F = TypeVar("F", bound=Callable[..., Any])

LEVELS = ("token", "turn", "trajectory")
# What an algorithm may need the trainer to provide, and what each means.
NEEDS: dict[str, str] = {
    "critic": "a learned value head, read at the algorithm's level (token or turn boundaries)",
    "clusters": "an observation-cluster id on every step row (SLEA-RL's index)",
    "reference": "reference-policy log-probs of every response token",
    "snapshots": "env snapshots at turn boundaries, to fork sibling rollouts",
    "team": "a team of agents sharing one context",
    "offline_data": "a dataset of recorded trajectories or preference pairs",
}

ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm", ("slea.algorithms.advantages", "slea.algorithms.gae",
                                                          "slea.algorithms.rtpo",
                                                          "slea.algorithms.teamtr"))
POLICY_LOSSES: Registry[Callable[..., Any]] = Registry("policy loss", ("slea.algorithms.losses",
                                                                      "slea.algorithms.entropy",
                                                                      "slea.algorithms.teamtr"))


@dataclass(frozen=True)
class AlgorithmSpec:
    """What the trainer needs to know about an algorithm (see the module docstring)."""

    name: str
    estimator: Callable[..., Any]
    level: str
    needs: frozenset[str] = frozenset()
    settings: tuple[str, ...] = ()  # the estimator's keyword-only parameters
    required: tuple[str, ...] = ()  # settings without a default
    defaults: Mapping[str, Any] = field(default_factory=dict)  # dotted config key -> value, unless the user sets it
    summary: str = ""


def _keyword_settings(fn: Callable[..., Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
    return tuple(p.name for p in params), tuple(p.name for p in params if p.default is p.empty)


def register_algorithm(name: str, *, level: str, needs: Iterable[str] = (), defaults: Mapping[str, Any] | None = None,
                       replace: bool = False) -> Callable[[F], F]:
    """Decorator: register ``fn(batch: StepBatch, *, <settings>)`` as algorithm ``name``.

    ``fn`` returns one advantage per step row (``level`` ``trajectory`` or ``turn``) or an
    :class:`slea.algorithms.batch.Advantages` (``token`` level, or when it also returns critic targets).
    ``needs``: keys of :data:`NEEDS`. ``defaults``: config values it implies (``{"experience.mode": "step"}``),
    applied when the user's config does not set them. A name already taken is an error unless ``replace``."""
    key = norm_name(name, "algorithm")
    if level not in LEVELS:
        raise ValueError(f"algorithm {key!r}: level must be one of {', '.join(LEVELS)}, got {level!r}")
    unknown = sorted(set(needs) - set(NEEDS))
    if unknown:
        raise ValueError(f"algorithm {key!r}: unknown needs {unknown}; known: {', '.join(NEEDS)}")

    def spec(fn: Callable[..., Any]) -> AlgorithmSpec:
        settings, required = _keyword_settings(fn)
        doc = inspect.getdoc(fn) or ""
        return AlgorithmSpec(key, fn, level, frozenset(needs), settings, required, dict(defaults or {}),
                             doc.split("\n\n")[0].replace("\n", " "))

    return ALGORITHMS.decorator(key, replace=replace, wrap=spec)


def register_policy_loss(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Decorator: register ``fn(logprobs, old_logprobs, advantages, mask, **settings) -> (loss, metrics)`` as
    a policy loss (see :mod:`slea.algorithms.losses`); a name already taken is an error unless ``replace``."""
    return POLICY_LOSSES.decorator(name, replace=replace)


def get_algorithm(name: str) -> AlgorithmSpec:
    """The spec registered as ``name`` (or ``"module:function"``); :class:`KeyError` listing the known names."""
    return ALGORITHMS.get(name)


def get_policy_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as ``name`` (or ``"module:function"``); :class:`KeyError` listing the known."""
    return POLICY_LOSSES.get(name)


def algorithm_names() -> list[str]:
    """Sorted names of every registered algorithm (built-ins included)."""
    return ALGORITHMS.names()


def policy_loss_names() -> list[str]:
    """Sorted names of every registered policy loss (built-ins included; imports torch)."""
    return POLICY_LOSSES.names()
