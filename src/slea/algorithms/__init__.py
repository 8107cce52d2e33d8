"""Algorithms: advantage estimators registered with their specs, policy losses, KL penalties and GAE.

``compute_advantages``, the registries and the typed batch import only numpy. The torch parts (``losses``,
``kl``) are imported on first use of one of their names, so ``from slea.algorithms import compute_advantages``
stays cheap. Token-level GAE is ``slea.algorithms.gae.gae`` (exported here as ``token_gae``: the name ``gae`` on
this package is the submodule).
"""

from __future__ import annotations

import importlib
from typing import Any

from slea.algorithms.advantages import (
    compute_advantages,
    discounted_returns,
    episode_returns,
    group_normalize,
    index_rows,
    leave_one_out,
    whiten,
)
from slea.algorithms.batch import Advantages, StepBatch, estimate
from slea.algorithms.gae import token_gae, turn_gae
from slea.algorithms.registry import (
    NEEDS,
    AlgorithmSpec,
    algorithm_names,
    get_algorithm,
    get_policy_loss,
    policy_loss_names,
    register_algorithm,
    register_policy_loss,
)

_LAZY = {
    "aggregate": "losses",
    "value_loss": "losses",
    "AGG_MODES": "losses",
    "kl_penalty": "kl",
    "kl_estimator_names": "kl",
}

__all__ = [
    "AGG_MODES",
    "NEEDS",
    "Advantages",
    "AlgorithmSpec",
    "StepBatch",
    "aggregate",
    "algorithm_names",
    "compute_advantages",
    "discounted_returns",
    "episode_returns",
    "estimate",
    "get_algorithm",
    "get_policy_loss",
    "group_normalize",
    "index_rows",
    "kl_estimator_names",
    "kl_penalty",
    "leave_one_out",
    "policy_loss_names",
    "register_algorithm",
    "register_policy_loss",
    "token_gae",
    "turn_gae",
    "value_loss",
    "whiten",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"slea.algorithms.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
