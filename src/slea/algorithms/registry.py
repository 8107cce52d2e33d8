"""Name -> function registries for advantage estimators and policy losses.

Algorithms register themselves with a decorator where they are defined (in the manner of verl's
``core_algos.py``), so adding one never means touching a dispatch chain::

    @register_advantage("my_estimator")
    def my_estimator(rows, rewards, anchors, clusters, *, gamma, step_weight, std_norm, eps): ...

Names are case-insensitive and ``-`` equals ``_`` (``clip-higher`` finds ``clip_higher``). Looking up an
unknown name raises :class:`KeyError` whose message lists the known names. This module imports nothing heavy:
the first lookup imports the module that holds the algorithms (``advantages`` for estimators, ``losses``, which
needs torch, for policy losses).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_ADVANTAGES: dict[str, Callable] = {}
_POLICY_LOSSES: dict[str, Callable] = {}
_HOME = {"advantage": "slea.algorithms.advantages", "policy loss": "slea.algorithms.losses"}


def _norm(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"an algorithm name must be a non-empty string, got {name!r}")
    return name.strip().lower().replace("-", "_")


def _register(table: dict[str, Callable], kind: str, name: str, replace: bool = False) -> Callable[[F], F]:
    key = _norm(name)

    def deco(fn: F) -> F:
        if key in table and table[key] is not fn and not replace:
            raise ValueError(f"{kind} {key!r} is already registered (by {table[key].__qualname__})")
        table[key] = fn
        return fn

    return deco


def _get(table: dict[str, Callable], kind: str, name: str) -> Callable:
    key = _norm(name)
    if key not in table:
        importlib.import_module(_HOME[kind])  # registers the built-in algorithms on first use
    try:
        return table[key]
    except KeyError:
        known = ", ".join(sorted(table)) or "(none)"
        raise KeyError(f"unknown {kind} {name!r}; known: {known}") from None


def register_advantage(name: str) -> Callable[[F], F]:
    """Decorator: register an advantage estimator under ``name`` (see :mod:`slea.algorithms.advantages`)."""
    return _register(_ADVANTAGES, "advantage", name)


def register_policy_loss(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Decorator: register a policy loss under ``name`` (see :mod:`slea.algorithms.losses`); a name already taken
    is an error unless ``replace``."""
    return _register(_POLICY_LOSSES, "policy loss", name, replace)


def get_advantage(name: str) -> Callable:
    """The estimator registered as ``name``; :class:`KeyError` listing the known names if there is none."""
    return _get(_ADVANTAGES, "advantage", name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as ``name``; :class:`KeyError` listing the known names if there is none."""
    return _get(_POLICY_LOSSES, "policy loss", name)


def advantage_names() -> list[str]:
    """Sorted names of every registered advantage estimator (built-ins included)."""
    importlib.import_module(_HOME["advantage"])
    return sorted(_ADVANTAGES)


def policy_loss_names() -> list[str]:
    """Sorted names of every registered policy loss (built-ins included; imports torch)."""
    importlib.import_module(_HOME["policy loss"])
    return sorted(_POLICY_LOSSES)
